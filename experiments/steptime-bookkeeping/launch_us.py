"""Is ``launch_us`` identifiable once the bookkeeping term is in? The four values fitted together from
three starts and with each source left out (scipy's Nelder-Mead on tools/fit_steptime.py's objective,
launch_us bounded to 0-200 us). Issue 65 asked for it to be refitted.

    cd experiments/steptime-bookkeeping && ../../.venv/bin/python launch_us.py > launch_us.txt
"""

import json
import math
from dataclasses import replace
from pathlib import Path

from scipy.optimize import minimize

from pytest_llmbench.planner import steptime, validation

ROOT = Path(__file__).resolve().parents[2]
FREE = ("gemm", "attention", "memory", "launch_us")
rows = json.loads((ROOT / "tests" / "data" / "published_steps.json").read_text())["rows"]


def objective(values, rows):
    if any(v < 0 for v in values) or any(v > 1.0 for v in values[:3]) or values[3] > 200:
        return 10.0
    fit = replace(steptime.FIT, **dict(zip(FREE, values, strict=True)))
    return sum(abs(math.log(validation.predict_row(r, fit).tokens_per_s_per_device
                            / r["tokens_per_s_per_device"])) for r in rows) / len(rows)


def fit(rows, start):
    best = minimize(objective, start, args=(rows,), method="Nelder-Mead",
                    options={"xatol": 1e-3, "fatol": 1e-5, "maxiter": 3000})
    said = ", ".join(f"{k} {v:.4g}" for k, v in zip(FREE, best.x, strict=True))
    return f"{said} (objective {best.fun:.5f})"


for start in ([0.977, 0.483, 0.461, 2.95], [0.8, 0.5, 0.5, 10.0], [0.8, 0.5, 0.5, 1.0]):
    print(f"all rows from {start}: {fit(rows, start)}", flush=True)
for source in sorted({r["source"] for r in rows}):
    print(f"without {source}: {fit([r for r in rows if r['source'] != source], [0.8, 0.5, 0.5, 3.0])}",
          flush=True)
