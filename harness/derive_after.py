"""What the launcher side derives of a finished result, beside what its ranks derived (harness/derive.py):
against its scaling baseline, its cost, the launcher's wall time, and the plugins' metrics.

Standard library only. Metric definitions (docs/METRICS.md):

- scaling_efficiency E(N) = tps(N) / (N / N0 x tps(N0)), N0 = baseline world size.
- the overhead split (``overhead_split``): step_overhead against the same strategy's baseline at N0,
  wrapper_overhead_s = step(N0) - compute-only(N0) and exposed_comm_s = (step(N) - compute-only(N))
  - wrapper_overhead_s (harness/derive.py's docstring says why).
- tokens_per_usd = tokens_per_s x 3600 / (usd_per_device_hour x world_size);
  usd_per_million_tokens = 1e6 / tokens_per_usd; usd_per_thousand_samples = 1e3 x seq_len / tokens_per_usd.
- launch_overhead_s = the launcher's wall time less the time inside the timed phases.
"""

from __future__ import annotations

from harness import instruments, metrics
from harness.result import BenchResult


def scaling_efficiency(*, tokens_per_s: float, world_size: int,
                       baseline_tokens_per_s: float, baseline_world_size: int) -> float:
    """Weak-scaling efficiency E(N) = tps(N) / (N / N0 x tps(N0))."""
    return tokens_per_s / (world_size / baseline_world_size * baseline_tokens_per_s)


def with_scaling(result: BenchResult, baseline: BenchResult | None, reason: str = "") -> BenchResult:
    """The result with scaling_efficiency against ``baseline``, or empty with ``reason``."""
    metrics, nulls = dict(result.metrics), dict(result.null_reasons)
    if baseline is None or not baseline.ok or not result.ok:
        metrics.update(scaling_efficiency=None, scaling_baseline_world_size=None,
                       scaling_baseline_run_id=None)
        nulls["scaling_efficiency"] = reason or "no successful baseline run"
    else:
        metrics["scaling_efficiency"] = scaling_efficiency(
            tokens_per_s=result.metrics["tokens_per_s"], world_size=result.spec.world_size,
            baseline_tokens_per_s=baseline.metrics["tokens_per_s"],
            baseline_world_size=baseline.spec.world_size)
        metrics["scaling_baseline_world_size"] = baseline.spec.world_size
        metrics["scaling_baseline_run_id"] = baseline.run_id
        nulls.pop("scaling_efficiency", None)
    return result.replace(metrics=metrics, null_reasons=nulls)


def overhead_split(*, step_s: float, compute_s: float, base_step_s: float, base_compute_s: float,
                   ) -> dict[str, float]:
    """The step's overhead over the bare model, split into the wrapper's (measured at the baseline
    world size) and the communication left exposed at this world size (see the module doc)."""
    wrapper_s = base_step_s - base_compute_s
    exposed_s = (step_s - compute_s) - wrapper_s
    return {"wrapper_overhead_s": wrapper_s, "exposed_comm_s": exposed_s,
            "wrapper_overhead": wrapper_s / step_s, "exposed_comm": exposed_s / step_s}


SPLIT = ("wrapper_overhead_s", "exposed_comm_s", "wrapper_overhead", "exposed_comm")


def with_overhead_split(result: BenchResult, baseline: BenchResult | None, reason: str = "") -> BenchResult:
    """The result with ``overhead_split`` against ``baseline`` (itself at N0), or empty with a reason."""
    metrics, nulls = dict(result.metrics), dict(result.null_reasons)
    sides = [r for r in (result, baseline) if r is not None and r.ok]
    if len(sides) < 2 or any(r.metrics.get("compute_only_step_time_s") is None for r in sides):
        metrics.update(dict.fromkeys(SPLIT))
        nulls["exposed_comm"] = reason or ("no successful baseline run" if len(sides) < 2 else
                                           "no compute-only step at this world size or the baseline's")
    else:
        metrics.update(overhead_split(
            step_s=result.metrics["step_time_median_s"], compute_s=result.metrics["compute_only_step_time_s"],
            base_step_s=baseline.metrics["step_time_median_s"],
            base_compute_s=baseline.metrics["compute_only_step_time_s"]))
        nulls.pop("exposed_comm", None)
    return result.replace(metrics=metrics, null_reasons=nulls)


def with_cost(result: BenchResult, usd_per_device_hour: float | None) -> BenchResult:
    """The result with tokens_per_usd and usd_per_million_tokens at the given price."""
    metrics, nulls = dict(result.metrics), dict(result.null_reasons)
    metrics["usd_per_device_hour"] = usd_per_device_hour
    if not result.ok or not usd_per_device_hour:
        metrics["tokens_per_usd"] = metrics["usd_per_million_tokens"] = None
        metrics["usd_per_thousand_samples"] = None
        nulls["tokens_per_usd"] = ("run did not finish" if not result.ok
                                   else "no usd_per_device_hour in the profile")
    else:
        usd_per_s = usd_per_device_hour * result.spec.world_size / 3600.0
        metrics["tokens_per_usd"] = result.metrics["tokens_per_s"] / usd_per_s
        metrics["usd_per_million_tokens"] = 1e6 / metrics["tokens_per_usd"]
        metrics["usd_per_thousand_samples"] = 1e3 * result.spec.seq_len / metrics["tokens_per_usd"]
    return result.replace(metrics=metrics, null_reasons=nulls)


def with_wall_time(result: BenchResult, wall_time_s: float) -> BenchResult:
    """The result with the launcher's wall time and the launch overhead it implies.

    launch_overhead_s = wall time - time inside warm-up and measured steps - the
    compute-only probe (its build and steps: a measurement, not launch cost) - each instrument's
    steps (--llmbench-trace, --llmbench-memory: harness/instruments): what is left is process
    start, imports, rendezvous, model build, wrap and teardown.
    """
    metrics = dict(result.metrics)
    timed = sum(result.warmup_step_times_s) + sum(result.step_times_s)
    timed += result.phases_s.get("compute_probe_s", sum(result.compute_only_step_times_s))
    timed += sum(result.phases_s.get(instruments.phase_key(name), 0.0) for name in result.instruments)
    metrics["launch_overhead_s"] = wall_time_s - timed if result.ok else None
    return result.replace(wall_time_s=wall_time_s, metrics=metrics)


def with_plugin_metrics(result: BenchResult) -> BenchResult:
    """The result with every plugin metric (``Metric.derive``) of the metric table; a metric whose
    derivation raises is left empty with the error as its reason (never a made-up value)."""
    added = [m for m in metrics.table() if m.derive is not None]
    if not added or not result.ok:
        return result
    values, nulls = dict(result.metrics), dict(result.null_reasons)
    for metric in added:
        try:
            values[metric.name] = metric.derive(result)
        except Exception as exc:  # a plugin's bug must not lose the measured result
            values[metric.name] = None
            nulls[metric.name] = f"derive of plugin metric {metric.name} failed: {exc!r}"
    return result.replace(metrics=values, null_reasons=nulls)
