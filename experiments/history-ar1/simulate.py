"""The history's change points under nightly noise that is not independent (issue 66): the project's own
``report/changes.across`` on seeded AR(1) series, with the noise's autocorrelation pooled over the history
(now) and with the iid null it used before (``pooled_rho`` held at 0, the null's floor at 1/20,001).

    .venv/bin/python experiments/history-ar1/simulate.py > experiments/history-ar1/output.txt

Series are log tokens/s: AR(1) noise of marginal sd ``cv`` (innovations scaled so), plus a step where said.
- false change points per 100 flat series of 60 sessions (cv 15%), mean over 20 histories;
- a 10% step at session 12 of 20 (cv 5%): found within one session of it, alone (400 series) and beside
  100 flat series (200 histories);
- 5,000 series, one with a 30% step at session 12 of 20 (cv 5%): reported or not (5 histories).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_llmbench.report import changes  # noqa: E402


@contextlib.contextmanager
def iid_floor():
    """The detector as it was: an iid null (rho 0) and p-values floored at 1/(NULL_DRAWS + 1)."""
    saved = changes.pooled_rho, changes.p_value

    def floored(stat, n, rho=0.0):
        null = changes._null(n, 0.0)
        return (1 + len(null) - np.searchsorted(null, stat, side="left")) / (1 + len(null))

    changes.pooled_rho, changes.p_value = (lambda series, found=None: 0.0), floored
    try:
        yield
    finally:
        changes.pooled_rho, changes.p_value = saved


def noise(rng, rows: int, n: int, rho: float, cv: float) -> np.ndarray:
    return changes.ar1(rng, rows, n, rho) * cv


def false_points(rng, rho: float) -> float:
    return float(np.mean([sum(len(found) for found in changes.across(list(noise(rng, 100, 60, rho, 0.15))))
                          for _ in range(20)]))


def found_step(rng, rho: float, others: int, histories: int) -> float:
    hits = 0
    for _ in range(histories):
        step = noise(rng, 1, 20, rho, 0.05)[0] + np.log(np.r_[np.ones(11), np.full(9, 0.9)])
        points = changes.across([list(step), *noise(rng, others, 20, rho, 0.05)])[0]
        hits += any(abs(i - 11) <= 1 for i, _ in points)
    return hits / histories


def reported_at_5000(rng) -> int:
    hits = 0
    for _ in range(5):
        step = noise(rng, 1, 20, 0.0, 0.05)[0] + np.log(np.r_[np.ones(11), np.full(9, 0.7)])
        hits += bool(changes.across([list(step), *noise(rng, 4_999, 20, 0.0, 0.05)])[0])
    return hits


def main() -> None:
    for label, context in (("before: iid null, floored p", iid_floor), ("now: AR(1) null, fitted tail",
                                                                       contextlib.nullcontext)):
        with context():
            print(f"== {label}")
            for rho in (0.0, 0.3, 0.5):
                rng = np.random.default_rng([2026, int(rho * 10)])
                print(f"  rho {rho}: false change points per 100 flat series of 60 sessions: "
                      f"{false_points(rng, rho):.2f}")
            for rho in (0.0, 0.5):
                rng = np.random.default_rng([1129, int(rho * 10)])
                alone, beside = found_step(rng, rho, 0, 400), found_step(rng, rho, 100, 200)
                print(f"  rho {rho}: 10% step at session 12 of 20, cv 5%: found {alone:.1%} alone, "
                      f"{beside:.1%} beside 100 flat series")
            reported = reported_at_5000(np.random.default_rng(5000))
            print(f"  5,000 series, one 30% step: reported in {reported} of 5 histories")


if __name__ == "__main__":
    main()
