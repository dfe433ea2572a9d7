"""The trials of one case and what they add up to; stats.py does the arithmetic.

A trial is one launch of a case. With one trial per case every function here gives what
a single run gives (no interval), so the plugin and the report have one code path.
"""

from __future__ import annotations

import math
from typing import Any

from harness import metrics
from harness.result import BenchResult
from pytest_llmbench import gate_rules, stats


def values(results: list[BenchResult], metric: str) -> list[float]:
    """The metric's value in each ok trial that has one."""
    return [r.metrics[metric] for r in results if r.ok and r.metrics.get(metric) is not None]


def efficiency(at_n: list[BenchResult], at_base: list[BenchResult]) -> stats.Ratio:
    """Weak-scaling efficiency of trials at N against trials at the baseline N0:
    E = mean tokens/s(N) / (N / N0 x mean tokens/s(N0)), with the interval of the ratio of
    means divided by N / N0. When every trial at N has its baseline from the same round (the
    same trial index) and there are two or more, the interval is paired (stats.
    paired_ratio_interval: a drift that moves a round's both runs cancels); else it is the
    unpaired one over all trials of both world sizes (stats.ratio_interval)."""
    n, n0 = at_n[0].spec.world_size, at_base[0].spec.world_size
    pairs = _round_pairs(at_n, at_base)
    if pairs is not None and len(pairs) >= 2 and len(pairs) == len(values(at_base, "tokens_per_s")):
        r = stats.paired_ratio_interval(pairs)
    else:
        r = stats.ratio_interval(values(at_n, "tokens_per_s"), values(at_base, "tokens_per_s"))
    scale = n0 / n
    return stats.Ratio(r.value * scale, r.low and r.low * scale, r.high and r.high * scale, r.method)


def efficiency_check(at_n: list[BenchResult], at_base: list[BenchResult], floor: float, *,
                     noise_cv: float, alpha: float = gate_rules.ALPHA, session_var: float = 0.0,
                     history: tuple[float, int] | None = None) -> gate_rules.GateVerdict:
    """Scaling efficiency against a floor with the gate's false-alarm budget (gate_rules.floor_check): on
    the per-round efficiencies when every trial at N has its own round's baseline, else on the two
    sides' trials (gate_rules.gate's fail rule with the floor as 1 - allowed drop); ``session_var`` and
    ``history``: the store's sessions of the case (compare_gate.history), as gate_rules.gate takes them."""
    n, n0 = at_n[0].spec.world_size, at_base[0].spec.world_size
    pairs = _round_pairs(at_n, at_base)
    if pairs:
        return gate_rules.floor_check([math.log(a * n0 / (n * b)) for a, b in pairs], floor,
                                      noise_cv=noise_cv, alpha=alpha, session_var=session_var,
                                      history=history)
    scaled = [v * n0 / n for v in values(at_n, "tokens_per_s")]
    return gate_rules.gate(scaled, values(at_base, "tokens_per_s"), 1 - floor, noise_cv=noise_cv, alpha=alpha)


def _round_pairs(at_n: list[BenchResult], at_base: list[BenchResult]) -> list[tuple[float, float]] | None:
    """(tokens/s at N, tokens/s of its own round's baseline) for every ok trial at N, or None when
    one of them has no baseline trial of its round."""
    base = {r.trial: r.metrics["tokens_per_s"] for r in at_base if r.ok and r.metrics.get("tokens_per_s")}
    ok = [r for r in at_n if r.ok and r.metrics.get("tokens_per_s")]
    if not all(r.trial in base for r in ok):
        return None
    return [(r.metrics["tokens_per_s"], base[r.trial]) for r in ok]


def describe(r: stats.Ratio, what: str) -> str:
    """``0.812 (95% interval 0.78-0.84, 3 vs 3 trials)``, or the value and why there is none."""
    if r.low is None:
        return f"{r.value:.3f} ({what}: {r.method})"
    return f"{r.value:.3f} (95% interval {r.low:.3f}-{r.high:.3f}, {what})"


def gate_text(metric: str, pct: float, new: list[float], old: list[float],
              verdict: gate_rules.GateVerdict) -> str:
    """What the regression gate decided, in words a CI log reader can act on: the ratio and its
    bounds, the trials on each side and the error rates of the rule."""
    outcome = {"fail": "dropped", "pass": "held", "inconclusive": "inconclusive"}[verdict.outcome]
    single = (" (one trial a side: the declared launch noise is the spread; use --llmbench-trials 3 or "
              "more and --llmbench-trials-max for a decision from measured noise)"
              if len(new) == 1 and len(old) == 1 else "")
    return (f"{metric} {outcome}: mean {stats.summary(new).mean:.4g} over {len(new)} trial(s) vs "
            f"{stats.summary(old).mean:.4g} over {len(old)} in the compared run, allowed drop {pct:g}%; "
            f"{verdict.text}{single}")


def summary_row(results: list[BenchResult], metric: str = "tokens_per_s") -> dict[str, Any]:
    """n, mean, median, 95% interval and cv of a metric over the ok trials (None where unknown)."""
    data = values(results, metric)
    if not data:
        return {"n": 0, "mean": None, "median": None, "low": None, "high": None, "cv": None}
    s = stats.summary(data)
    return {"n": s.n, "mean": s.mean, "median": s.median, "low": s.low, "high": s.high, "cv": s.cv}


def extra_info(results: list[BenchResult]) -> dict[str, Any]:
    """The case's aggregate for pytest-benchmark's extra_info (flat, JSON-friendly)."""
    info: dict[str, Any] = {"llmbench_trials_ok": len([r for r in results if r.ok]),
                            "llmbench_interval": f"{stats.CONFIDENCE:.0%} t-interval of trial means"}
    for metric in metrics.names(spread=True):  # the metric table's rows with a trial spread
        for key, value in summary_row(results, metric).items():
            if key != "n":
                info[f"trials_{metric}_{key}"] = value
    return info
