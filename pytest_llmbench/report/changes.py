"""Change points of a history series, with a stated false-alarm rate across every series of a report.

A series is one number per stored session (a case's mean over its trials), on the log scale. The
test of "this series changed level somewhere" is the maximum over split points k of the two-sample
t statistic |mean(x[k:]) - mean(x[:k])| / (s sqrt(1/k + 1/(n-k))), s the pooled sd of the two
segments, each at least MIN_SEGMENT sessions (the likelihood-ratio test for one change in mean at an
unknown place: Hawkins 1977; binary segmentation, Scott & Knott 1974, splits again on each side).
Its null distribution, the series' sessions independent and alike, does not depend on their level or
spread: it is drawn once per length from NULL_DRAWS standard normal series (seeded, cached), so its
p-value counts the search over every split point, where a t-test at the chosen point would not.

Across series, the change-or-not p-values of every series in the history are held to a false
discovery rate of FDR by Benjamini and Hochberg's step-up (1995): a history of many flat series
reports about FDR series with a false change in all, not one per so many series; a series that
passes splits again on each side at the level its step reached. A change smaller than MIN_CHANGE is
not reported, whatever its p-value.

tests/unit/test_history.py measures both rates: false change points in 100 flat series of 60 and of
100 sessions at the cpu profile's 15% noise, and how often a 10% step at session 12 of 20 at 5%
noise is found within one session of it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

MIN_SEGMENT = 3  # sessions on each side of a change: a change is reported once 3 sessions confirm it
NULL_DRAWS = 20_000  # standard normal series per length for the null distribution
FDR = 0.05  # Benjamini-Hochberg across the series of a history
MIN_CHANGE = 0.02  # a relative change below this is not reported


def max_t(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise (max |t| over the split points with MIN_SEGMENT on each side, where it is), for a
    (rows, n) array."""
    n = x.shape[1]
    c1, c2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    k = np.arange(1, n)
    s1, s2, t1, t2 = c1[:, :-1], c2[:, :-1], c1[:, -1:], c2[:, -1:]
    left, right = s1 / k, (t1 - s1) / (n - k)
    ss = (s2 - s1 * left) + ((t2 - s2) - (t1 - s1) * right)
    sd = np.sqrt(np.maximum(ss / (n - 2), 1e-300))
    t = np.abs(right - left) / (sd * np.sqrt(1 / k + 1 / (n - k)))
    t = np.where((k >= MIN_SEGMENT) & (n - k >= MIN_SEGMENT), t, 0.0)
    return t.max(axis=1), t.argmax(axis=1) + 1


@functools.lru_cache(maxsize=256)
def _null(n: int) -> np.ndarray:
    """The sorted max |t| of NULL_DRAWS standard normal series of length n (seeded: reproducible)."""
    rng = np.random.default_rng(n)
    return np.sort(max_t(rng.standard_normal((NULL_DRAWS, n)))[0])


def changed(x: list[float]) -> tuple[float, int]:
    """(p-value, split point) of the max-t test on ``x``; p = 1 when too short to split."""
    n = len(x)
    if n < 2 * MIN_SEGMENT:
        return 1.0, 0
    stat, at = max_t(np.asarray(x, dtype=float)[None, :])
    null = _null(n)
    exceed = len(null) - np.searchsorted(null, stat[0], side="left")
    return (1 + exceed) / (1 + len(null)), int(at[0])


def segment(x: list[float], level: float, offset: int = 0) -> list[tuple[int, float]]:
    """Binary segmentation at ``level``: [(index of the first point after a change, p-value)]."""
    p, k = changed(x)
    if p > level or k == 0:
        return []
    return [*segment(x[:k], level, offset), (offset + k, p), *segment(x[k:], level, offset + k)]


def across(series: list[list[float]], fdr: float = FDR) -> list[list[tuple[int, float]]]:
    """Every series' change points (log values in, [(index, p)] out), the series held together to
    ``fdr`` by Benjamini-Hochberg on their first tests; then MIN_CHANGE on each change's size from
    its adjacent segments."""
    first = [changed(x)[0] for x in series]
    order = sorted(range(len(series)), key=lambda i: first[i])
    passed = 0
    for rank, i in enumerate(order, 1):  # the step-up: the largest rank whose p is under its line
        if first[i] <= fdr * rank / len(series):
            passed = rank
    level = fdr * passed / max(1, len(series))
    out = []
    for x in series:
        found = segment(x, level) if passed else []
        out.append([(i, p) for i, p in found if abs(size(x, found, i)) >= MIN_CHANGE])
    return out


def size(x: list[float], found: list[tuple[int, float]], index: int) -> float:
    """The relative change at ``index`` from its adjacent segments' means of the log values."""
    bounds = [0, *(i for i, _ in found), len(x)]
    k = bounds.index(index)
    before, after = x[bounds[k - 1]:index], x[index:bounds[k + 1]]
    return math.exp(sum(after) / len(after) - sum(before) / len(before)) - 1
