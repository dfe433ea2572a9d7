"""Statistics over trials. A trial is one launch of a case; its value is one number per metric.

Per-step times share one process and are autocorrelated, so they understate how much a
case moves from launch to launch (up to 15% on a shared machine). The unit of evidence here
is the trial: intervals are taken over trial values, never over steps.

- ``summary(values)``: n, mean, median, sample standard deviation, coefficient of variation
  and a 95% Student t-interval of the mean (n - 1 degrees of freedom).
- ``ratio_interval(a, b)``: 95% interval of mean(a) / mean(b) for independent trials: a
  Welch t-interval on the log scale (delta method: se^2 = cv_a^2 / n_a + cv_b^2 / n_b,
  Welch-Satterthwaite degrees of freedom), exponentiated. Scaling efficiency uses it with
  a = tokens/s at N, b = tokens/s at the baseline, divided by N / N0.
- ``paired_ratio_interval(pairs)``: the same ratio when each trial of a has its b from the same
  round (scaling efficiency: a case and its baseline): the delta method with their covariance,
  n - 1 degrees of freedom.
- ``compare``: "a is faster" only when the ratio's interval lies wholly beyond 1 +/- the
  noise threshold; otherwise no significant difference.
- ``trials_needed``: how many trials a side ``compare`` needs to call a lead.

With one trial on a side there is no interval (``None``). The gates' pass/fail rules over these
intervals are pytest_llmbench/gate_rules.py.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
NOISE = 0.02  # a lead smaller than this is no lead, even when the interval excludes 1


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    stdev: float | None  # None with one trial
    cv: float | None
    low: float | None  # 95% t-interval of the mean
    high: float | None


def summary(values: list[float], confidence: float = CONFIDENCE) -> Summary:
    if not values:
        raise ValueError("no trial values")
    n, mean, median = len(values), statistics.fmean(values), statistics.median(values)
    if n == 1:
        return Summary(n, mean, median, None, None, None, None)
    sd = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return Summary(n, mean, median, sd, sd / mean if mean else None, mean - half, mean + half)


@dataclass(frozen=True)
class Ratio:
    value: float  # mean(a) / mean(b)
    low: float | None
    high: float | None
    method: str


RATIO_METHOD = "95% Welch t-interval of the log ratio of trial means (delta method)"


def ratio_interval(a: list[float], b: list[float], confidence: float = CONFIDENCE) -> Ratio:
    sa, sb = summary(a), summary(b)
    value = sa.mean / sb.mean
    if sa.n < 2 or sb.n < 2:
        return Ratio(value, None, None, "one trial on a side: no interval")
    va, vb = sa.cv ** 2 / sa.n, sb.cv ** 2 / sb.n  # variances of log(mean), delta method
    se = math.sqrt(va + vb)
    if se == 0:
        return Ratio(value, value, value, RATIO_METHOD)
    df = (va + vb) ** 2 / (va ** 2 / (sa.n - 1) + vb ** 2 / (sb.n - 1))
    half = t_quantile(0.5 + confidence / 2, df) * se
    return Ratio(value, value * math.exp(-half), value * math.exp(half), RATIO_METHOD)


PAIRED_METHOD = "95% paired t-interval of the log ratio of trial means over the rounds (delta method)"
PAIRED_ROUNDS_METHOD = ("95% t-interval of the mean of the rounds' log ratios, exponentiated (the A/B "
                        "gate's own estimator: each round's candidate over its baseline)")


def paired_log_ratios(pairs) -> list[float]:
    """log(a / b) of each (a, b) pair of positive numbers (others left out): each A/B round's paired
    ratio, which the gate (``paired_gate``) and the report (``mean_log_ratio_interval``) both read."""
    return [math.log(a / b) for a, b in pairs if all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                     and x > 0 for x in (a, b))]


def mean_log_ratio_interval(log_ratios: list[float], confidence: float = CONFIDENCE) -> Ratio:
    """exp(mean log ratio) with its t-interval (n - 1 df): what the A/B gate tests, for the report."""
    mean, n = statistics.fmean(log_ratios) if log_ratios else math.nan, len(log_ratios)
    if n < 2:
        return Ratio(math.exp(mean), None, None, "one round: no interval" if n else "no paired round")
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(log_ratios) / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), PAIRED_ROUNDS_METHOD)


def paired_ratio_interval(pairs: list[tuple[float, float]], confidence: float = CONFIDENCE) -> Ratio:
    """95% interval of mean(a) / mean(b) when each a was measured in the same round as its b (a
    case and its baseline in one round of trials): the delta method with the covariance of the
    pairs, se^2 = (cv_a^2 + cv_b^2 - 2 cov(a, b) / (mean_a mean_b)) / n, n - 1 degrees of freedom.
    A drift of the machine that moves both sides of a round cancels instead of widening it."""
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    value = statistics.fmean(a) / statistics.fmean(b)
    n = len(pairs)
    if n < 2:
        return Ratio(value, None, None, "one round: no interval")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in pairs) / (n - 1)
    var = (statistics.variance(a) / ma ** 2 + statistics.variance(b) / mb ** 2 - 2 * cov / (ma * mb)) / n
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(max(var, 0.0))
    return Ratio(value, value * math.exp(-half), value * math.exp(half), PAIRED_METHOD)


def compare(a: list[float], b: list[float], noise: float = NOISE) -> str:
    """'higher', 'lower' or 'same' for a against b (higher is better): 'higher' only if the whole interval
    of a/b (with one trial a side, the point ratio) is above 1 + noise."""
    r = ratio_interval(a, b)
    low, high = (r.low, r.high) if r.low is not None else (r.value, r.value)
    if low > 1 + noise:
        return "higher"
    if high < 1 - noise:
        return "lower"
    return "same"


def _phi(x: float) -> float:
    """The standard normal cdf (scipy's norm.cdf, without its per-call overhead)."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def z_quantile(p: float) -> float:
    """The standard normal quantile (the standard library's; equal to scipy's norm.ppf)."""
    return statistics.NormalDist().inv_cdf(p)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (the normal one at df = inf); scipy imported here: it takes 1.5 s."""
    if math.isinf(df):
        return z_quantile(p)
    from scipy.stats import t

    return float(t.ppf(p, df))


def trials_needed(cv: float, difference: float, confidence: float = CONFIDENCE, power: float = 0.8,
                  noise: float = NOISE, limit: int = 100_000) -> int | None:
    """Trials per side for ``compare`` (the report's rule: the whole interval of the ratio beyond
    1 + noise) to call a lead of ``difference`` (relative) with probability ``power``, at this
    trial-to-trial cv. On the log scale the interval's low end is log r - t SE, SE = cv sqrt(2/n),
    t on 2n - 2 degrees of freedom, so n = 2 (t + z_power)^2 cv^2 / (log(1 + d) - log(1 + noise))^2,
    solved with its own t; at least 2. None when ``difference`` is within the noise: the rule
    never calls such a lead, at any n (nor above ``limit``)."""
    gap = math.log1p(difference) - math.log1p(noise)
    if gap <= 0:
        return None
    z_power = z_quantile(power)

    def enough(n: int) -> bool:  # monotone in n: more trials, a smaller t and a smaller SE
        return n >= 2 * (t_quantile(0.5 + confidence / 2, 2 * n - 2) + z_power) ** 2 * cv * cv / (gap * gap)

    if not enough(limit):
        return None
    low, high = 2, limit  # the smallest n that is enough, by bisection
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid + 1, high)
    return low
