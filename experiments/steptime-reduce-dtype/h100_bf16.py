"""What the H100 rows would give reduced in bf16 (Composer 0.16.3) rather than fp32 (0.16.4): the three
values refitted with every llm-foundry row (H100 and A100) timed as ``bf16-reduce``, and the summary by
device and source. The shipped data keep the H100 rows in fp32 (tests/data/published_steps.json says
why); this is the other reading, for docs/PLAN.md.

    cd experiments/steptime-reduce-dtype && ../../.venv/bin/python h100_bf16.py > h100_bf16.txt
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import fit_steptime  # noqa: E402

from pytest_llmbench.planner import validation  # noqa: E402

rows = [{**r, "reduce_dtype": "bf16"} if r["source"] == "llm-foundry" else r
        for r in json.loads(fit_steptime.DATA.read_text())["rows"]]
fit = fit_steptime.fitted(rows)
values = [getattr(fit, k) for k in fit_steptime.FREE]
print("every llm-foundry row bf16: " + ", ".join(f"{k} {v:.4g}" for k, v in zip(fit_steptime.FREE, values,
                                                                                strict=True))
      + f" (objective {fit_steptime.objective(values, rows):.4f})")
print(fit_steptime.summary(validation.validate(rows, fit)))
