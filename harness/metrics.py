"""The metric table: one row per metric of a training result, the one place its name is typed.

Standard library only. The store loader (CSV columns), the aggregation over trials, the report's
formats and winners table, the regression gate's choices, pytest-benchmark's extra_info and the
terminal summary all read it; the values are derived in harness/derive.py (and, for scaling
efficiency, again in the report from the rows it shows). Adding a metric is its row here plus its
derivation. The definitions are docs/METRICS.md's (printed from this table); units are in the names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENTRY_POINT_GROUP = "pytest_llmbench.metrics"
MEAN = "mean"  # a case's value is the mean over its ok trials
LATEST = "latest"  # the latest trial's (the same in every trial, or not averaged)


@dataclass(frozen=True)
class Metric:
    """``higher``: True when higher is better, False when lower is, None when neither. ``trials``:
    how a case aggregates it over trials (MEAN or LATEST). ``spread``: the trial spread (mean,
    interval, cv) goes to pytest-benchmark's extra_info. ``fmt``: the report's format. ``winner``:
    the winners-table category that ranks cases by it. ``summary``: its column header and format
    spec in the terminal summary. ``derive``: for a plugin's metric, how the plugin derives it from a finished
    BenchResult (None when the result has no value); the built-in ones are derived in harness/derive.py.
    ``on_result``: the value is a BenchResult field, not in its metrics (wall_time_s). ``column``: its
    header in the report's All cases table (None: not a column there), in table order."""

    name: str
    unit: str
    definition: str
    higher: bool | None = None
    trials: str = MEAN
    spread: bool = False
    fmt: str | None = None
    winner: str | None = None
    summary: tuple[str, str] | None = None  # (header, format spec) in the terminal summary
    derive: Callable[[Any], float | None] | None = None
    on_result: bool = False
    column: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("n_params", "parameters", "all parameters of the model as built", trials=LATEST, fmt="{:,.0f}"),
    Metric("n_trainable_params", "parameters", "parameters the optimizer updates (LoRA: the adapters)",
           trials=LATEST, fmt="{:,.0f}"),
    Metric("n_params_non_embedding", "parameters", "N of the FLOPs formula (non-embedding, + tied head)",
           trials=LATEST),
    Metric("tokens_per_step", "tokens", "world_size x micro_batch x grad_accum x seq_len", trials=LATEST),
    Metric("tokens_per_s", "tokens/s", "tokens per step / mean step time", True, spread=True,
           fmt="{:,.0f}", winner="Highest throughput (tokens/s)", summary=("tokens/s", ".0f"),
           column="tokens/s"),
    Metric("tokens_per_s_per_device", "tokens/s", "tokens_per_s / world_size", True, spread=True,
           fmt="{:,.0f}", column="tokens/s/device"),
    Metric("samples_per_s", "sequences/s", "tokens_per_s / seq_len", True, fmt="{:,.1f}"),
    Metric("step_time_mean_s", "s", "mean step time: one optimizer step, slowest rank, warm-up excluded",
           False, spread=True),
    Metric("step_time_median_s", "s", "median step time", False, fmt="{:.4f}", summary=("step p50 s", ".4f"),
           column="step p50 s"),
    Metric("step_time_p90_s", "s", "90th percentile step time (linear interpolation)", False, fmt="{:.4f}",
           column="step p90 s"),
    Metric("step_time_p99_s", "s", "99th percentile step time", False),
    Metric("step_time_stddev_s", "s", "sample standard deviation of the step times", False),
    Metric("step_time_min_s", "s", "fastest step", False),
    Metric("step_time_max_s", "s", "slowest step", False),
    Metric("peak_memory_gib", "GiB", "max over ranks: CUDA max_memory_allocated, or peak RSS on CPU", False,
           spread=True, fmt="{:.3f}", winner="Lowest peak memory (GiB)", summary=("peak GiB", ".3f"),
           column="peak mem GiB"),
    Metric("peak_memory_kind", "", "which counter peak_memory_gib read", trials=LATEST),
    Metric("mfu", "fraction", "flops_per_token x tokens_per_s_per_device / peak dense bf16 FLOP/s", True,
           spread=True, fmt="{:.1%}", winner="Highest MFU", summary=("MFU", ".1%"), column="MFU"),
    Metric("hfu", "fraction", "mfu x hardware/model FLOPs (with ac: + what the checkpoint recomputes)", True),
    Metric("tflops_per_device", "TFLOP/s", "model FLOPs per token x tokens_per_s_per_device / 1e12", True),
    Metric("flops_per_token", "FLOP", "model FLOPs of one token (flops_formula)", trials=LATEST),
    Metric("peak_flops_per_device", "FLOP/s", "the device's dense bf16 peak (mfu_basis)", trials=LATEST),
    Metric("compute_only_step_time_s", "s", "median step of the unwrapped model, no collectives", False),
    Metric("compile_s", "s", "variant compile: warm-up steps' time above the steady step (median of the "
           "measured steps that compiled nothing), slowest rank: what compiling cost the case", False,
           fmt="{:.1f}"),
    Metric("recompiles", "frames", "variant compile: frames dynamo compiled during the measured steps (most "
           "on a rank)", False, trials=LATEST, fmt="{:.0f}"),
    Metric("graph_breaks", "breaks", "variant compile: dynamo's graph breaks over the case (most on a rank)",
           False, trials=LATEST, fmt="{:.0f}"),
    Metric("compile_cache_hits", "fraction", "variant compile: the share of inductor's graphs its FX graph "
           "cache served (1: a warm cache, 0: compiled cold)", trials=LATEST, fmt="{:.0%}"),
    Metric("step_overhead", "fraction", "1 - compute-only step / step (medians)", False, fmt="{:.1%}",
           column="overhead"),
    Metric("wrapper_overhead", "fraction", "wrapper_overhead_s / step", False, fmt="{:.1%}",
           column="wrapper"),
    Metric("exposed_comm", "fraction", "exposed_comm_s / step", False, fmt="{:.1%}", column="exposed comm."),
    Metric("wrapper_overhead_s", "s", "step(N0) - compute-only(N0): the wrapper's own cost", False),
    Metric("exposed_comm_s", "s", "(step(N) - compute-only(N)) - wrapper_overhead_s", False),
    Metric("scaling_efficiency", "fraction", "weak: tps(N) / (N / N0 x tps(N0)); strong: N0 T(N0) / (N T(N))",
           True, trials=LATEST, fmt="{:.2f}", winner="Best scaling efficiency", summary=("eff", ".2f"),
           column="efficiency"),
    Metric("scaling_baseline_world_size", "ranks", "N0, the world size efficiency divides by", trials=LATEST),
    Metric("usd_per_device_hour", "$/device-hour", "the profile's price", trials=LATEST, fmt="{:.3f}"),
    Metric("tokens_per_usd", "tokens/$", "tokens_per_s x 3600 / (usd_per_device_hour x world_size)", True,
           fmt="{:,.0f}"),
    Metric("usd_per_million_tokens", "$", "1e6 / tokens_per_usd", False, spread=True, fmt="{:.4f}",
           winner="Cheapest ($ per 1M tokens)"),
    Metric("usd_per_thousand_samples", "$", "1e3 x seq_len / tokens_per_usd", False, fmt="{:.4f}"),
    Metric("energy_j", "J", "the hardware's energy counters over the measured steps (energy_basis: NVML "
           "per GPU summed, or RAPL per host)", False, fmt="{:,.1f}"),
    Metric("joules_per_token", "J/token", "energy_j / tokens of the measured steps", False, spread=True,
           fmt="{:.4g}"),
    Metric("tokens_per_kwh", "tokens/kWh", "3.6e6 / joules_per_token", True, fmt="{:,.0f}"),
    Metric("trace_exposed_comm", "fraction", "traced steps: communication not under compute / step, mean "
           "over ranks (harness/instruments/trace.py; --llmbench-trace)", False, trials=LATEST, fmt="{:.1%}"),
    Metric("trace_comm_hidden", "fraction", "traced steps: share of communication time under compute, mean "
           "over ranks", None, trials=LATEST, fmt="{:.1%}"),
    Metric("trace_idle", "fraction", "traced steps: neither compute nor communication / step, mean over "
           "ranks",
           False, trials=LATEST, fmt="{:.1%}"),
    Metric("straggler_ratio", "ratio", "median over compute-only probe steps of slowest rank / median rank "
           "(collective-free, so the slow rank is not hidden by the others' waits)", False, trials=LATEST,
           fmt="{:.3f}"),
    Metric("straggler_ratio_max", "ratio", "largest per-step slowest / median rank of the probe steps", False,
           trials=LATEST, fmt="{:.3f}"),
    Metric("slowest_rank", "rank", "the rank slowest in the most compute-only probe steps", trials=LATEST),
    Metric("slowest_rank_share", "fraction", "share of the probe steps slowest_rank was slowest in",
           trials=LATEST, fmt="{:.0%}"),
    Metric("loss_first", "", "training loss of the first step, mean over ranks"),
    Metric("loss_last", "", "training loss of the last step, mean over ranks", fmt="{:.4f}"),
    Metric("launch_overhead_s", "s", "wall time - warm-up, measured steps and the compute-only probe",
           False, fmt="{:.1f}", summary=("overhead s", ".1f")),
    Metric("wall_time_s", "s", "the whole case as the launcher saw it", False, on_result=True),
)
# Words and ids that explain a value (kept in a result's metrics beside it; not metrics themselves).
NOTES = ("flops_formula", "mfu_basis", "hfu_basis", "scaling_baseline_run_id", "energy_basis")
# The values of a result's metrics that are words; every other one is a finite number or null.
TEXT = (*NOTES, "peak_memory_kind")
_ADDED: dict[str, Metric] = {}
_loaded = False


def register(metric: Metric, *, derived_on_rank: bool = False) -> Metric:
    """Add a plugin's metric (with its ``derive``, or ``derived_on_rank`` by its instrument:
    harness/instruments); a name already in the table is an error."""
    if metric.name in {m.name for m in METRICS} or _ADDED.get(metric.name, metric) != metric:
        raise ValueError(f"metric {metric.name!r} is already in the metric table")
    if metric.derive is None and not derived_on_rank:
        raise ValueError(f"metric {metric.name!r}: a plugin's metric needs its derive function")
    _ADDED[metric.name] = metric
    return metric


def plugins() -> tuple[Metric, ...]:
    """The metrics plugins added (the rows beyond the built-in table)."""
    table()
    return tuple(_ADDED.values())


def table() -> tuple[Metric, ...]:
    """Every metric: the built-in rows, then those of plugins (entry points, pytest hooks)."""
    global _loaded
    if not _loaded:
        _loaded = True
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            register(point.load())
    return METRICS + tuple(_ADDED.values())


def names(**having: object) -> list[str]:
    """The metrics whose fields have these values, in table order, e.g. ``names(trials=MEAN)``."""
    return [m.name for m in table() if all(getattr(m, k) == v for k, v in having.items())]


def gated() -> list[str]:
    """The metrics a regression gate can hold: those with a better direction (higher or lower)."""
    return [m.name for m in table() if m.higher is not None]


def winners() -> list[Metric]:
    """The metrics the report ranks cases by, each with its category."""
    return [m for m in table() if m.winner]
