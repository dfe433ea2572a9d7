"""Threshold verdicts: pure functions from results and a profile to the words of a failure, or
None when the threshold holds. runner.Runner.check collects them and fails the test once with
all of them; tests/unit/test_verdicts.py checks each alone.
"""

from __future__ import annotations

import math

from harness.bandwidth import OPS
from harness.result import BenchResult
from pytest_llmbench import gate_rules
from pytest_llmbench.profiles import Profile


def failed_trials(runs: list[BenchResult]) -> str | None:
    """The trials of a case that did not finish, each with its status and first error line."""
    failed = [r for r in runs if not r.ok]
    if not failed:
        return None
    said = "; ".join(f"trial {r.trial}: {r.status}: {(r.error or '?').splitlines()[0][:120]}" for r in failed)
    return f"{len(failed)} of {len(runs)} trials failed ({said})"


def peak_memory(ok: list[BenchResult], profile: Profile, alpha: float = gate_rules.ALPHA,
                history: tuple[float, float, int] | None = None) -> str | None:
    """The finished trials' peak memory against the profile's budget, at its share ``alpha`` of the
    session's error budget (gate_rules.floor_check on log(budget / peak) against 1): fails only when the
    one-sided (1 - alpha) lower bound of the (geometric) mean peak is above the budget, so a case truly
    at the budget fails at most ``alpha`` of the time. The spread: the trials', widened by the session
    effect the store shows, or with one trial the spread of the store's sessions of the case; else the
    profile's memory_noise_cv. ``history``: (session effect variance, one session's variance across the
    store or None, its degrees of freedom), from compare_gate.history."""
    peaks = [r for r in ok if r.metrics.get("peak_memory_gib") is not None]
    budget = profile.max_peak_memory_gib
    if budget is None or not peaks:
        return None
    values = [r.metrics["peak_memory_gib"] for r in peaks]
    session_var, total, df = history or (0.0, None, 0)
    verdict = gate_rules.floor_check([math.log(budget / v) for v in values], 1.0,
                                noise_cv=profile.memory_noise_cv, launches=1, alpha=alpha,
                                declared="memory noise (memory_noise_cv)", session_var=session_var,
                                history=(total, df) if total is not None else None)
    if verdict.outcome == "pass":
        return None
    top = max(peaks, key=lambda r: r.metrics["peak_memory_gib"])
    mean, low = budget / verdict.ratio.value, budget / verdict.ratio.high
    return (f"peak memory {mean:.3f} GiB exceeds the {profile.name} budget of {budget:g} GiB "
            f"({top.metrics['peak_memory_kind']}; mean of {len(values)} trial(s), "
            f"largest {max(values):.3f}): "
            f"its one-sided {100 - 100 * alpha:.6g}% lower bound {low:.3f} GiB is above the budget "
            f"(false-alarm budget {gate_rules.share(alpha)}; spread: {verdict.noise})")


def scaling(fails: bool | None, text: str, world_size: int, profile: Profile) -> str | None:
    """A case's scaling efficiency against the profile's floor at ``world_size``: ``fails`` and
    ``text`` from gate_rules.floor_check (the one-sided bound, the trials and the error rates), None
    when the efficiency is unknown (which fails when a floor is set)."""
    floor = profile.min_scaling_efficiency.get(world_size)
    if floor is None:
        return None
    if fails is None:
        return f"scaling efficiency unknown ({text}); the {profile.name} profile requires >= {floor:g}"
    if fails:
        return (f"scaling efficiency {text} at ws{world_size} is below the {profile.name} threshold "
                f"{floor:g} with confidence")
    return None


def busbw(result: BenchResult, profile: Profile) -> str | None:
    """Every collective's busbw at the probe's largest size against the profile's floor."""
    floor = profile.min_busbw_gbps
    if floor is None:
        return None
    low = [f"{op} {result.metrics[f'busbw_gbps_{op}']:.3g}" for op in OPS
           if result.metrics[f"busbw_gbps_{op}"] < floor]
    if not low:
        return None
    size = result.metrics["busbw_size_bytes"]
    return (f"{result.case_id}: busbw at {size:,} bytes below the {profile.name} threshold of {floor:g} GB/s "
            f"({profile.source}): {', '.join(low)} GB/s; NCCL falls back to TCP sockets where it finds "
            f"no InfiniBand/RoCE device (a pod needs the cluster's RDMA resource in the profile's [k8s] "
            f"extra_resources; NCCL_DEBUG=INFO names the transport used): check the links "
            f"(NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME) before trusting a training number")
