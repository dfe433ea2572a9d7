"""The history detector against Apache Otava on the same seeded draws (issue 52's history bounds).

    pip install --no-deps apache-otava==0.8.0   # (no longer a dependency of this project)
    .venv/bin/python experiments/history-otava/compare.py > experiments/history-otava/output.txt

Flat: 100 series of 60 sessions at 15% lognormal noise (the cpu profile's launch noise), counted
as one history. Step: 400 series of 20 sessions at 5% noise, tokens/s x 0.9 from session 12 on,
each a history of its own; found = a change point within one session of 12. Otava:
``compute_change_points`` at its defaults (window 50, p < 0.001) on the raw values, each series
alone; this project: ``report/changes.across`` on the log values.
"""

import math

import numpy as np
from otava.analysis import compute_change_points

from pytest_llmbench.report import changes

rng = np.random.default_rng(20261127)
flat = [list(np.exp(rng.normal(0, 0.15, 60))) for _ in range(100)]
steps = [list(np.exp(rng.normal(0, 0.05, 20) + np.where(np.arange(20) < 11, 0.0, math.log(0.9))))
         for _ in range(400)]


def otava(series):
    return [int(p.index) for p in compute_change_points(series)[0]]


def ours(series):
    return [i for i, _ in changes.across([[math.log(v) for v in series]])[0]]


print("detector  false change points in 100 flat series of 60  step found within one session (of 400)")
print(f"otava     {sum(len(otava(s)) for s in flat):>46}  "
      f"{sum(any(abs(i - 11) <= 1 for i in otava(s)) for s in steps) / 400:>6.1%}")
ours_flat = sum(len(found) for found in changes.across([[math.log(v) for v in s] for s in flat]))
print(f"changes   {ours_flat:>46}  {sum(any(abs(i - 11) <= 1 for i in ours(s)) for s in steps) / 400:>6.1%}")
