"""The history's change points under nightly noise that is not independent (issue 66): the project's own
``report/changes.across`` on seeded AR(1) series, five ways:
- before: the iid null it used first (``pooled_rho`` held at 0, the null's floor at 1/20,001), FDR 5%;
- AR(1), unmoderated: the autocorrelation pooled over the history, each series its own sd (stop 67),
  FDR 5%;
- moderated at FDR 5% (stops 68-71): that, and each series' sd moderated towards the history's
  (``changes.prior``);
- now: the same at ``changes.FDR`` (10%);
- oracle: the noise's true sd and rho given, not estimated (what no detector can beat), at 5% and at 10%.

    (time .venv/bin/python experiments/history-ar1/simulate.py) > experiments/history-ar1/output.txt 2>&1

Series are log tokens/s: AR(1) noise of marginal sd ``cv`` (innovations scaled so), plus a step where said.
- false change points per 100 flat series of 60 sessions (cv 15%), mean over 20 histories;
- a 10% step at session 12 of 20 (cv 5%): found within one session of it, alone (1,000 series) and beside
  100 flat series (1,000 histories each: a rate within about 2.5 points at 95%); for the detector as
  shipped, 3,000 more histories beside 100 series with the reported rate's 95% interval;
- 5,000 series, one with a 30% step at session 12 of 20 (cv 5%): reported or not (5 histories);
- now only: false change points when the series' noise differs (half at cv 5%, half at 15%; cv spread
  log-normally, sd 0.5 on the log scale), where the prior is not the shape it assumes.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_llmbench.report import changes  # noqa: E402


@contextlib.contextmanager
def fdr(level: float):
    """Benjamini-Hochberg at ``level`` instead of ``changes.FDR`` (``across``'s default)."""
    saved = changes.across.__defaults__
    changes.across.__defaults__ = (level,)
    try:
        yield
    finally:
        changes.across.__defaults__ = saved


@contextlib.contextmanager
def unmoderated():
    """Each series its own sd: no prior pooled over the history."""
    saved = changes.prior
    changes.prior = lambda series, rho: (0.0, 1.0)
    try:
        yield
    finally:
        changes.prior = saved


@contextlib.contextmanager
def oracle(rho: float, cv: float):
    """The true rho and sd given: a prior of infinite degrees of freedom at the true variance."""
    saved = changes.prior, changes.pooled_rho
    changes.prior = lambda series, _rho: (math.inf, cv * cv)
    changes.pooled_rho = lambda series, found=None: rho
    try:
        yield
    finally:
        changes.prior, changes.pooled_rho = saved


@contextlib.contextmanager
def iid_floor():
    """The detector as it was: an iid null (rho 0) and p-values floored at 1/(NULL_DRAWS + 1)."""
    saved = changes.pooled_rho, changes.p_value

    def floored(stat, n, rho=0.0, d0=0.0):
        null = changes._null(n, 0.0)
        return (1 + len(null) - np.searchsorted(null, stat, side="left")) / (1 + len(null))

    changes.pooled_rho, changes.p_value = (lambda series, found=None: 0.0), floored
    try:
        with unmoderated():
            yield
    finally:
        changes.pooled_rho, changes.p_value = saved


def noise(rng, rows: int, n: int, rho: float, cv: float) -> np.ndarray:
    return changes.ar1(rng, rows, n, rho) * cv


def false_points(rng, rho: float, cvs=(0.15,) * 100) -> float:
    cv = np.asarray(cvs)[:, None]
    return float(np.mean([sum(len(found) for found in changes.across(list(noise(rng, len(cvs), 60, rho, 1) * cv)))
                          for _ in range(20)]))


def found_step(rng, rho: float, others: int, histories: int) -> tuple[float, float]:
    """(found within one session of the step, reported at all) in the step's series."""
    hits = reported = 0
    for _ in range(histories):
        step = noise(rng, 1, 20, rho, 0.05)[0] + np.log(np.r_[np.ones(11), np.full(9, 0.9)])
        points = changes.across([list(step), *noise(rng, others, 20, rho, 0.05)])[0]
        hits += any(abs(i - 11) <= 1 for i, _ in points)
        reported += bool(points)
    return hits / histories, reported / histories


def reported_at_5000(rng) -> int:
    hits = 0
    for _ in range(5):
        step = noise(rng, 1, 20, 0.0, 0.05)[0] + np.log(np.r_[np.ones(11), np.full(9, 0.7)])
        hits += bool(changes.across([list(step), *noise(rng, 4_999, 20, 0.0, 0.05)])[0])
    return hits


def main() -> None:
    def at(level, inner):
        stack = contextlib.ExitStack()
        stack.enter_context(fdr(level))
        stack.enter_context(inner)
        return stack

    detectors = (("before: iid null, floored p, FDR 5%", lambda rho: at(0.05, iid_floor())),
                 ("AR(1) null, fitted tail, unmoderated, FDR 5% (stop 67)", lambda rho: at(0.05, unmoderated())),
                 ("AR(1) null, fitted tail, sd moderated, FDR 5% (stops 68-71)",
                  lambda rho: at(0.05, contextlib.nullcontext())),
                 (f"now: AR(1) null, fitted tail, sd moderated, FDR {changes.FDR:.0%}",
                  lambda rho: contextlib.nullcontext()),
                 ("oracle: true sd and rho given, FDR 5%", lambda rho: at(0.05, oracle(rho, 0.05))),
                 (f"oracle: true sd and rho given, FDR {changes.FDR:.0%}", lambda rho: oracle(rho, 0.05)))
    for label, context in detectors:
        print(f"== {label}")
        if not label.startswith("oracle"):
            for rho in (0.0, 0.3, 0.5):
                rng = np.random.default_rng([2026, int(rho * 10)])
                with context(rho):
                    print(f"  rho {rho}: false change points per 100 flat series of 60 sessions: "
                          f"{false_points(rng, rho):.2f}")
        for rho in (0.0, 0.5):
            rng = np.random.default_rng([1129, int(rho * 10)])
            with context(rho):
                alone, beside = found_step(rng, rho, 0, 1000), found_step(rng, rho, 100, 1000)
            print(f"  rho {rho}: 10% step at session 12 of 20, cv 5%: found within one session {alone[0]:.1%} "
                  f"alone, {beside[0]:.1%} beside 100 flat series (reported at all: {alone[1]:.1%}, "
                  f"{beside[1]:.1%})")
        if not label.startswith("oracle"):
            with context(0.0):
                reported = reported_at_5000(np.random.default_rng(5000))
            print(f"  5,000 series, one 30% step: reported in {reported} of 5 histories")
    print(f"== now (FDR {changes.FDR:.0%}), rho 0: the 10% step beside 100 flat series, 3,000 more histories")
    reported = found_step(np.random.default_rng(3000), 0.0, 100, 3000)[1]
    half = 1.96 * math.sqrt(reported * (1 - reported) / 3000)
    print(f"  reported {reported:.1%} (95% interval {reported - half:.1%}-{reported + half:.1%})")
    print("== now, noise that differs between series (false change points per 100 flat series of 60)")
    for rho in (0.0, 0.5):
        rng = np.random.default_rng([77, int(rho * 10)])
        half = false_points(rng, rho, (0.05,) * 50 + (0.15,) * 50)
        spread = false_points(rng, rho, tuple(0.05 * np.exp(rng.normal(0, 0.5, 100))))
        print(f"  rho {rho}: half at cv 5%, half at 15%: {half:.2f}; cv log-normal (sd 0.5): {spread:.2f}")


if __name__ == "__main__":
    main()
