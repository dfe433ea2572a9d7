"""Change points of a history series, with a stated false-alarm rate across every series of a report.

A series is one number per stored session (a case's mean over its trials), on the log scale. The
test of "this series changed level somewhere" is the maximum over split points k of the two-sample t
statistic |mean(x[k:]) - mean(x[:k])| / (s sqrt(1/k + 1/(n-k))), s the pooled sd of the two
segments, each at least MIN_SEGMENT sessions (the likelihood-ratio test for one change in mean at an
unknown place: Hawkins 1977; binary segmentation, Scott & Knott 1974, splits again on each side).
Its null distribution does not depend on the series' level or spread, but it does on how alike
neighbouring sessions are: nightly runs share a runner's weather (a noisy neighbour for a few days,
a driver update), and positively autocorrelated noise makes an iid null list false changes (5-64 per
100 series at AR(1) rho 0.3-0.5). So the noise is taken as AR(1), its lag-1 autocorrelation ``rho``
pooled over every series of the history (``pooled_rho``: the residuals of each segment between the
changes found, so a step is not read as autocorrelation; the pooled estimate's small-sample bias
removed by matching it to its own expectation, simulated per segment length; segmentation and rho
alternate until rho settles), and the null is drawn once per length and rho (on a 0.05 grid) from
NULL_DRAWS AR(1) series (seeded, cached), so its p-value counts the search over every split point
and the dependence between sessions. Beyond the largest draws the p-value comes from a generalised
Pareto tail fitted to the top TAIL_DRAWS of the null (Hosking and Wallis's probability-weighted
moments), not a floor: at 5,000 series Benjamini-Hochberg's smallest line is 1e-5, below
1/NULL_DRAWS, and a floor there would hide every change.

The noise sd of a series of 20 sessions is itself a noisy estimate (18 degrees of freedom), and at the
p-values a history of 100 series needs that costs much of the test's power: a 10% step at 5% noise was
found beside 100 flat series a third of the time, against four times in five for a test that knew the
sd. The series of one history share a runner, so their variances are alike: each series' sd is
moderated towards the history's (Smyth 2004, limma's empirical Bayes: the spread of the series'
log variances beyond their sampling noise gives a scaled inverse chi-square prior of d0 degrees of
freedom and scale s0^2, and a series' variance becomes (d0 s0^2 + (n-2) s^2) / (d0 + n - 2)). The null
is drawn with each series' variance from that prior, so the test stays exact when variances differ:
d0 is small and little is pooled. A history of fewer than MIN_SERIES series is tested unmoderated.

Across series, the change-or-not p-values of every series in the history are held to a false
discovery rate of FDR by Benjamini and Hochberg's step-up (1995): a history of many flat series
reports a false change in at most FDR of such histories, not one per so many series; a series that
passes splits again on each side at the level its step reached. A change smaller than MIN_CHANGE is
not reported, whatever its p-value. FDR is 10%, not 5%: the history is a report, not a gate (no
session fails on it), and its budget is issue 66's, at most 5 false change points per 100 flat
series of 60 sessions, which 10% spends 0.1-0.3 of. At 100 series it asks a lone change for p <=
0.001, Apache Otava's default per series. A 10% step at 5% noise beside 100 flat series is reported
73.5% of the time at 5%, 81-84% at 10% (experiments/history-ar1/: 1,000 and 3,000 histories).

tests/unit/test_history.py measures both rates: false change points in 100 flat series of 60 and of
100 sessions at the cpu profile's 15% noise, and how often a 10% step at session 12 of 20 at 5%
noise is found within one session of it; experiments/history-ar1/ the same under AR(1) noise, with
variances that differ between series, beside a test that knows the noise (the oracle), and at 5,000
series.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

MIN_SEGMENT = 3  # sessions on each side of a change: a change is reported once 3 sessions confirm it
NULL_DRAWS = 20_000  # standard normal series per length for the null distribution
FDR = 0.10  # Benjamini-Hochberg across the series of a history (module docstring: why 10%)
MIN_CHANGE = 0.02  # a relative change below this is not reported


def max_t(x: np.ndarray, d0: float = 0.0, s0sq: float | np.ndarray = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise (max |t| over the split points with MIN_SEGMENT on each side, where it is), for a
    (rows, n) array. The best split is the least-squares one (the largest between-segment sum of
    squares B); its t is sqrt(B) over the noise sd. With ``d0`` 0 that sd is the row's own residual sd
    at the split (n - 2 degrees of freedom), which makes this the max over splits of the two-sample t;
    with a prior (``d0`` > 0, ``s0sq``) it is moderated towards the prior's (module docstring)."""
    n = x.shape[1]
    c1, c2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    k = np.arange(1, n)
    s1, t1, t2 = c1[:, :-1], c1[:, -1:], c2[:, -1:]
    left, right = s1 / k, (t1 - s1) / (n - k)
    between = (right - left) ** 2 / (1 / k + 1 / (n - k))
    between = np.where((k >= MIN_SEGMENT) & (n - k >= MIN_SEGMENT), between, -1.0)
    at = between.argmax(axis=1)
    best = np.maximum(between[np.arange(len(x)), at], 0.0)
    s2 = np.maximum((t2[:, 0] - t1[:, 0] ** 2 / n - best) / (n - 2), 1e-300)
    if math.isinf(d0):
        s2 = np.broadcast_to(np.asarray(s0sq, dtype=float), s2.shape)
    elif d0 > 0:
        s2 = (d0 * np.asarray(s0sq, dtype=float) + (n - 2) * s2) / (d0 + n - 2)
    return np.sqrt(best / s2), at + 1


RHO_STEP, RHO_MIN, RHO_MAX = 0.05, -0.5, 0.9  # the grid rho is taken on, and its ends
RHO_GRID = np.round(np.arange(RHO_MIN, RHO_MAX + 1e-9, RHO_STEP), 2)
TAIL_DRAWS = 400  # the null's largest draws the generalised Pareto tail is fitted to
ROUNDS = 3  # segmentation and rho, alternated at most this often


def ar1(rng: np.random.Generator, rows: int, n: int, rho: float) -> np.ndarray:
    """``rows`` AR(1) series of length ``n``, unit variance, lag-1 autocorrelation ``rho``."""
    e = rng.standard_normal((rows, n))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    for t in range(1, n):
        x[:, t] = rho * x[:, t - 1] + math.sqrt(1 - rho * rho) * e[:, t]
    return x


def _lag_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise (sum of lag-1 products, sum of squares) of the residuals around each row's mean."""
    r = x - x.mean(axis=1, keepdims=True)
    return (r[:, 1:] * r[:, :-1]).sum(axis=1), (r * r).sum(axis=1)


@functools.lru_cache(maxsize=128)
def _expected_lag_sums(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rho of RHO_GRID, the mean (lag product sum, square sum) of the residuals of a unit AR(1)
    segment of length m around its own mean."""
    rng = np.random.default_rng(1_000 + m)
    sums = [_lag_sums(ar1(rng, 4_000, m, float(rho))) for rho in RHO_GRID]
    return np.array([a.mean() for a, _ in sums]), np.array([b.mean() for _, b in sums])


def pooled_rho(series: list[list[float]], found: list[list[tuple[int, float]]] | None = None) -> float:
    """The history's lag-1 autocorrelation (module docstring): the residuals of every segment of MIN_SEGMENT
    sessions or more around its own mean, between the change points ``found`` (none: each series whole),
    their lag products summed over their squares, then matched to that ratio's expectation under AR(1)
    for the same segment lengths (so the bias of residuals around estimated means is gone), on RHO_GRID.
    0 when no segment is long enough."""
    num = den = 0.0
    expected_num = expected_den = np.zeros(len(RHO_GRID))
    for k, x in enumerate(series):
        bounds = [0, *(i for i, _ in (found[k] if found else [])), len(x)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b - a < MIN_SEGMENT:
                continue
            lag, square = (float(v[0]) for v in _lag_sums(np.asarray(x[a:b], dtype=float)[None, :]))
            ea, eb = _expected_lag_sums(b - a)
            scale = square / max(float(eb[RHO_GRID.tolist().index(0.0)]), 1e-300)  # its variance, in units
            num, den = num + lag, den + square
            expected_num, expected_den = expected_num + ea * scale, expected_den + eb * scale
    if den <= 0:
        return 0.0
    curve = expected_num / expected_den  # increasing in rho
    return float(np.interp(num / den, curve, RHO_GRID))


def _on_grid(rho: float) -> float:
    return round(round(min(max(rho, RHO_MIN), RHO_MAX) / RHO_STEP) * RHO_STEP, 2)


D0_GRID = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, math.inf)  # the prior's df, floored onto
MIN_SERIES = 10  # series of one length-class needed before their variances are pooled into a prior
MOMENT_DRAWS = 4_000  # unit AR(1) series per (length, rho) for log s^2's mean and variance


@functools.lru_cache(maxsize=256)
def _null(n: int, rho: float = 0.0, d0: float = 0.0) -> np.ndarray:
    """The sorted max |t| of NULL_DRAWS AR(1) series of length n at ``rho`` (seeded: reproducible); with a
    prior of ``d0`` degrees of freedom each series' variance is drawn from it (scale 1: the statistic
    does not depend on the prior's scale) and the statistic is the moderated one."""
    rng = np.random.default_rng([n, int(round((rho - RHO_MIN) / RHO_STEP)), D0_GRID.index(d0)])
    x = ar1(rng, NULL_DRAWS, n, rho)
    if 0 < d0 < math.inf:
        x *= np.sqrt(d0 / rng.chisquare(d0, NULL_DRAWS))[:, None]
    return np.sort(max_t(x, d0, 1.0)[0])


@functools.lru_cache(maxsize=256)
def _tail(n: int, rho: float, d0: float = 0.0) -> tuple[float, float, float]:
    """(threshold, scale, shape k) of the generalised Pareto tail of ``_null(n, rho, d0)``'s top TAIL_DRAWS
    (probability-weighted moments, Hosking and Wallis 1987; survival (1 - k y / scale)^(1/k))."""
    null = _null(n, rho, d0)
    u = float(null[-TAIL_DRAWS - 1])
    y = np.sort(null[-TAIL_DRAWS:] - u)
    p = (np.arange(1, len(y) + 1) - 0.35) / len(y)
    a0, a1 = float(y.mean()), float(np.mean((1 - p) * y))
    k = a0 / (a0 - 2 * a1) - 2
    return u, 2 * a0 * a1 / (a0 - 2 * a1), k


def p_value(stat: float, n: int, rho: float = 0.0, d0: float = 0.0) -> float:
    """The max-t statistic's p-value at length ``n`` under AR(1) noise at ``rho`` (moderated by a prior of
    ``d0`` degrees of freedom): the null's share at or above it, or beyond its top TAIL_DRAWS, the
    fitted tail's."""
    rho = _on_grid(rho)
    null = _null(n, rho, d0)
    u, scale, k = _tail(n, rho, d0)
    if stat <= u:
        exceed = len(null) - np.searchsorted(null, stat, side="left")
        return (1 + exceed) / (1 + len(null))
    y = stat - u
    survival = math.exp(-y / scale) if abs(k) < 1e-6 else max(0.0, 1 - k * y / scale) ** (1 / k)
    return TAIL_DRAWS / (1 + len(null)) * survival


@functools.lru_cache(maxsize=256)
def _log_s2_moments(n: int, rho: float) -> tuple[float, float]:
    """(mean, variance) of log s^2, s^2 the residual variance at the least-squares split, for unit AR(1)
    series of length n at ``rho`` (what log s^2 would be with no spread between series' variances)."""
    rng = np.random.default_rng([7, n, int(round((rho - RHO_MIN) / RHO_STEP))])
    x = ar1(rng, MOMENT_DRAWS, n, rho)
    best = max_t(x)[0]  # sqrt(B / s2): recover s2 from B and the total
    total = ((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    log_s2 = np.log(total / (n - 2 + best ** 2))
    return float(log_s2.mean()), float(log_s2.var(ddof=1))


def residual_s2(x: list[float]) -> float:
    """The residual variance of ``x`` at its least-squares split (n - 2 degrees of freedom)."""
    a = np.asarray(x, dtype=float)
    t = float(max_t(a[None, :])[0][0])
    return float(((a - a.mean()) ** 2).sum()) / (len(a) - 2 + t * t)


def prior(series: list[list[float]], rho: float) -> tuple[float, float]:
    """(d0, s0^2): the spread of the series' noise variances, as a scaled inverse chi-square prior
    (Smyth 2004's empirical Bayes, limma's ``fitFDist``, its moments taken under AR(1) at ``rho`` by
    simulation rather than chi-square's): log s_i^2 less its mean for a unit series of its length is
    log sigma_i^2 plus noise of known variance; what variance is left over is the prior's, trigamma(d0/2).
    d0 is floored onto D0_GRID (a smaller d0 is the heavier null: conservative). (0, 1): no prior, when
    fewer than MIN_SERIES series are long enough to split."""
    z, noise = [], []
    for x in series:
        if len(x) >= 2 * MIN_SEGMENT:
            mean, var = _log_s2_moments(len(x), _on_grid(rho))
            z.append(math.log(max(residual_s2(x), 1e-300)) - mean)
            noise.append(var)
    if len(z) < MIN_SERIES:
        return NO_PRIOR
    left = float(np.var(z, ddof=1)) - float(np.mean(noise))
    d0 = math.inf if left <= float(special.polygamma(1, D0_GRID[-2] / 2)) else _trigamma_inverse(left) * 2
    d0 = max(g for g in D0_GRID if g <= d0)
    shift = 0.0 if d0 in (0.0, math.inf) else math.log(d0 / 2) - float(special.digamma(d0 / 2))
    return d0, math.exp(float(np.mean(z)) - shift)


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (Newton's method from Smyth's start, on 1 / x)."""
    x = 0.5 + 1 / y if y < 1e6 else 1 / math.sqrt(y)
    for _ in range(50):
        tri = float(special.polygamma(1, x))
        step = tri * (1 - tri / y) / float(special.polygamma(2, x))
        x += step
        if abs(step) < 1e-8 * x:
            break
    return max(x, 1e-6)


NO_PRIOR = (0.0, 1.0)  # (d0, s0^2): each series its own sd


def changed(x: list[float], rho: float = 0.0, moderated: tuple[float, float] = NO_PRIOR) -> tuple[float, int]:
    """(p-value, split point) of the max-t test on ``x`` under AR(1) noise at ``rho``, its noise sd
    moderated by the prior ``moderated`` (d0, s0^2); p = 1 when too short to split."""
    n = len(x)
    if n < 2 * MIN_SEGMENT:
        return 1.0, 0
    d0, s0sq = moderated
    stat, at = max_t(np.asarray(x, dtype=float)[None, :], d0, s0sq)
    return p_value(float(stat[0]), n, rho, d0), int(at[0])


def segment(x: list[float], level: float, offset: int = 0, rho: float = 0.0,
            moderated: tuple[float, float] = NO_PRIOR) -> list[tuple[int, float]]:
    """Binary segmentation at ``level``: [(index of the first point after a change, p-value)]."""
    p, k = changed(x, rho, moderated)
    if p > level or k == 0:
        return []
    return [*segment(x[:k], level, offset, rho, moderated), (offset + k, p),
            *segment(x[k:], level, offset + k, rho, moderated)]


def across(series: list[list[float]], fdr: float = FDR) -> list[list[tuple[int, float]]]:
    """Every series' change points (log values in, [(index, p)] out), under the AR(1) noise pooled over
    them (``pooled_rho``), the series held together to ``fdr`` by Benjamini-Hochberg on their first
    tests; then MIN_CHANGE on each change's size from its adjacent segments. Segmentation and rho
    alternate (rho from the residuals between the changes found so far, from rho 0) until rho settles,
    at most ROUNDS times: a step is not read as autocorrelation, nor autocorrelation as steps."""
    rho, found = 0.0, _found(series, fdr, 0.0)
    for _ in range(ROUNDS):
        settled = _on_grid(pooled_rho(series, found))
        if settled == rho:
            break
        rho, found = settled, _found(series, fdr, settled)
    return found


def _found(series: list[list[float]], fdr: float, rho: float) -> list[list[tuple[int, float]]]:
    moderated = prior(series, rho)
    first = [changed(x, rho, moderated)[0] for x in series]
    order = sorted(range(len(series)), key=lambda i: first[i])
    passed = 0
    for rank, i in enumerate(order, 1):  # the step-up: the largest rank whose p is under its line
        if first[i] <= fdr * rank / len(series):
            passed = rank
    level = fdr * passed / max(1, len(series))
    out = []
    for x in series:
        found = segment(x, level, rho=rho, moderated=moderated) if passed else []
        out.append([(i, p) for i, p in found if abs(size(x, found, i)) >= MIN_CHANGE])
    return out


def size(x: list[float], found: list[tuple[int, float]], index: int) -> float:
    """The relative change at ``index`` from its adjacent segments' means of the log values."""
    bounds = [0, *(i for i, _ in found), len(x)]
    k = bounds.index(index)
    before, after = x[bounds[k - 1]:index], x[index:bounds[k + 1]]
    return math.exp(sum(after) / len(after) - sum(before) / len(before)) - 1
