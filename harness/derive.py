"""The pure functions that derive a result's metrics (one row each in harness/metrics.py).

Standard library only. Metric definitions (docs/METRICS.md), units in every name:

- step time: wall time of one optimizer step (all grad-accum micro-batches), device
  synchronized before each clock read; per step the MAX over ranks; warm-up excluded.
- tokens_per_step = world_size x micro_batch x grad_accum x seq_len.
- tokens_per_s = tokens_per_step / mean step time; tokens_per_s_per_device = that / world_size.
- mfu = flops_per_token x tokens_per_s_per_device / peak dense bf16 FLOP/s (flops.py);
  hfu counts the recomputed forward of activation checkpointing too (HFU_BASIS).
- peak_memory_gib: max over ranks of CUDA max_memory_allocated, or of peak RSS on CPU.
- step_overhead = 1 - median compute-only step time / median step time, where the
  compute-only step is measured: the same model unwrapped on each rank, same micro-batch
  and grad-accum, no collectives (see harness/train.py). It is split, against the same
  strategy's baseline run at N0 (``overhead_split``), into
  wrapper_overhead_s = step(N0) - compute-only(N0): the wrapper's own cost (hooks, flattening,
  sharding bookkeeping, DeepSpeed's engine), where nothing or little is communicated, and
  exposed_comm_s = (step(N) - compute-only(N)) - wrapper_overhead_s: what the step adds at N
  beyond the wrapper and beyond any change of the bare model's own step; 0 at N0 by definition.
  wrapper_overhead and exposed_comm are those as shares of step(N) (medians throughout).
- samples_per_s = tokens_per_s / seq_len (a sample is one sequence).

What the launcher side adds to a finished result (against its baseline, its cost, its wall time) is
harness/derive_after.py.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from harness import compiled, energy
from harness.flops import (
    FLOPS_FORMULA,
    FLOPS_FORMULA_FROZEN,
    flops_per_token,
    mfu,
    non_embedding_params,
    peak_flops,
)
from harness.recompute import Recompute
from harness.shapes import adapter_params, block_matmuls, param_counts
from harness.spec import RunSpec


def step_stats(times_s: list[float]) -> dict[str, float]:
    """mean, median, p90, p99, stddev, min, max of step times, in seconds."""
    if not times_s:
        raise ValueError("no step times to summarize")
    data = sorted(times_s)
    return {
        "step_time_mean_s": statistics.fmean(data),
        "step_time_median_s": statistics.median(data),
        "step_time_p90_s": percentile(data, 90),
        "step_time_p99_s": percentile(data, 99),
        "step_time_stddev_s": statistics.stdev(data) if len(data) > 1 else 0.0,
        "step_time_min_s": data[0],
        "step_time_max_s": data[-1],
    }


def percentile(data: list[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of sorted or unsorted data."""
    data = sorted(data)
    pos = (len(data) - 1) * pct / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def max_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """Per step, the slowest rank's time: a step is done when every rank is done."""
    lengths = {len(times) for times in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks recorded different step counts: {sorted(lengths)}")
    return [max(step) for step in zip(*per_rank, strict=True)]


STRAGGLER_METRICS = ("straggler_ratio", "straggler_ratio_max", "slowest_rank", "slowest_rank_share")


def stragglers(per_rank: list[list[float]]) -> tuple[dict[str, float | int | None], str]:
    """Which rank is slow, from each rank's compute-only steps (the bare model, no collectives).

    Not from the measured steps: in synchronous training every collective makes the fast ranks
    wait for the slowest, so each rank's measured step lasts about as long as the straggler's and
    names nobody. Per probe step: ratio = slowest rank / median rank. straggler_ratio is the
    median of those ratios, straggler_ratio_max the largest; slowest_rank is the rank slowest in
    the most probe steps (the lowest rank on a tie), slowest_rank_share the share of steps it was.
    Returns ({metric: value}, "") or ({metric: None}, why they are empty)."""
    empty = dict.fromkeys(STRAGGLER_METRICS)
    if not per_rank:
        return empty, "no per-rank times recorded"
    if len(per_rank) < 2:
        return empty, "one rank: no other rank to be slower than"
    lengths = {len(times) for times in per_rank}
    if lengths == {0}:
        return empty, "no compute-only probe steps on each rank (compute_probe_steps = 0 or it failed)"
    if len(lengths) != 1:  # a rank whose probe failed (an OOM on its device) recorded none
        counts = ", ".join(f"rank {r}: {len(times)}" for r, times in enumerate(per_rank))
        return empty, f"ranks recorded different compute-only probe step counts ({counts})"
    steps = list(zip(*per_rank, strict=True))
    ratios = [max(step) / statistics.median(step) for step in steps]
    slowest = Counter(step.index(max(step)) for step in steps)
    rank, count = min(slowest.items(), key=lambda item: (-item[1], item[0]))
    return {"straggler_ratio": statistics.median(ratios), "straggler_ratio_max": max(ratios),
            "slowest_rank": rank, "slowest_rank_share": count / len(steps)}, ""


def peak_memory(memory_per_rank: list[dict[str, Any]]) -> tuple[float | None, str]:
    """(max over ranks in GiB, which counter). CUDA allocated peak, else CPU peak RSS."""
    if not memory_per_rank:
        return None, "none"
    if all(m.get("max_allocated_gib") is not None for m in memory_per_rank):
        return max(m["max_allocated_gib"] for m in memory_per_rank), "cuda_max_memory_allocated"
    if all(m.get("peak_rss_gib") is not None for m in memory_per_rank):
        return max(m["peak_rss_gib"] for m in memory_per_rank), "cpu_peak_rss"
    return None, "none"


def derive_metrics(spec: RunSpec, *, n_params: int, n_trainable: int, step_times_s: list[float],
                   compute_only_step_times_s: list[float], losses: list[float],
                   memory_per_rank: list[dict[str, Any]], device_name: str,
                   energy_per_rank: list[dict[str, Any]] | None = None, per_rank: list[dict] | None = None,
                   compiled_per_rank: list[dict | None] = (), warmup_step_times_s: list[float] = (),
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    """All derived metrics of a finished run, and the reason for each one left empty (the compile
    metrics from each rank's harness/compiled.py ``record``)."""
    metrics: dict[str, Any] = dict(step_stats(step_times_s))
    nulls: dict[str, str] = {}
    mean_s = metrics["step_time_mean_s"]
    metrics["tokens_per_step"] = spec.tokens_per_step
    metrics["tokens_per_s"] = spec.tokens_per_step / mean_s
    metrics["tokens_per_s_per_device"] = metrics["tokens_per_s"] / spec.world_size
    metrics["samples_per_s"] = metrics["tokens_per_s"] / spec.seq_len  # a sample: one sequence
    n_ne = non_embedding_params(n_params=n_params, n_embd=spec.n_embd, vocab_size=spec.vocab_size,
                                block_size=spec.block_size, learned_positions=spec.arch == "gpt",
                                tied_embedding=spec.tie_embeddings)
    frozen = spec.workload != "pretrain"
    fpt = flops_per_token(n_params_non_embedding=n_ne, n_layer=spec.n_layer, n_head=spec.n_head,
                          n_embd=spec.n_embd, seq_len=spec.seq_len,
                          n_trainable=n_trainable if frozen else None)
    metrics.update(n_params=n_params, n_params_non_embedding=n_ne, n_trainable_params=n_trainable,
                   flops_per_token=fpt, flops_formula=FLOPS_FORMULA_FROZEN if frozen else FLOPS_FORMULA,
                   tflops_per_device=fpt * metrics["tokens_per_s_per_device"] / 1e12)
    peak, how = (None, "CPU has no dense bf16 peak in the table; MFU left empty")
    if spec.device == "cuda":
        peak, how = peak_flops(device_name)
    metrics["peak_flops_per_device"] = peak
    metrics["mfu_basis"] = how
    if peak is None:
        metrics["mfu"] = metrics["hfu"] = None
        nulls["mfu"] = nulls["hfu"] = how
    else:
        metrics["mfu"] = mfu(flops_per_token=fpt, peak_flops_per_s=peak,
                             tokens_per_s_per_device=metrics["tokens_per_s_per_device"])
        factor = hardware_flops_factor(spec, fpt)
        metrics["hfu"] = metrics["mfu"] * factor if factor is not None else None
        if factor is None:
            nulls["hfu"] = "ac-op with adapters: the recomputed FLOPs are not counted (hfu_basis)"
    metrics["hfu_basis"] = HFU_BASIS
    metrics["peak_memory_gib"], metrics["peak_memory_kind"] = peak_memory(memory_per_rank)
    if metrics["peak_memory_gib"] is None:
        nulls["peak_memory_gib"] = "no memory counters were recorded"
    _overhead(metrics, nulls, compute_only_step_times_s)
    _energy(metrics, nulls, energy_per_rank or [], spec.tokens_per_step * len(step_times_s))
    found, why = stragglers([r.get("compute_only_step_times_s", []) for r in per_rank or []])
    metrics.update(found)
    if why:  # one reason for the four (the report's caveats list each reason once per metric)
        nulls["straggler_ratio"] = why
    metrics["loss_first"], metrics["loss_last"] = (losses[0], losses[-1]) if losses else (None, None)
    found, why = compiled.metrics(spec, list(compiled_per_rank), list(warmup_step_times_s), step_times_s)
    metrics.update(found)
    return metrics, {**nulls, **why}


def _overhead(metrics: dict[str, Any], nulls: dict[str, str], compute_only_step_times_s: list[float]) -> None:
    """The compute-only step (the probe's median) and the share of the step beside it."""
    if compute_only_step_times_s:
        compute_s = statistics.median(compute_only_step_times_s)
        metrics["compute_only_step_time_s"] = compute_s
        metrics["step_overhead"] = 1.0 - compute_s / metrics["step_time_median_s"]
    else:
        metrics["compute_only_step_time_s"] = metrics["step_overhead"] = None
        nulls["step_overhead"] = "compute-only probe not run (compute_probe_steps = 0 or it failed)"


def _energy(metrics: dict[str, Any], nulls: dict[str, str], energy_per_rank: list[dict[str, Any]],
            tokens: int) -> None:
    """Energy over the measured steps, per token and tokens per kWh, or the reason there is none."""
    joules, basis = energy.total(energy_per_rank)
    metrics["energy_j"], metrics["energy_basis"] = joules, basis
    if joules is None or not tokens:
        metrics["joules_per_token"] = metrics["tokens_per_kwh"] = None
        nulls["energy_j"] = nulls["joules_per_token"] = nulls["tokens_per_kwh"] = basis
    else:
        metrics["joules_per_token"] = joules / tokens
        metrics["tokens_per_kwh"] = tokens / (joules / 3.6e6) if joules > 0 else None
        if not joules > 0:
            nulls["tokens_per_kwh"] = "the counter did not move over the measured steps"


HFU_BASIS = ("hardware FLOPs: model FLOPs plus what activation recompute runs again (harness/recompute.py): "
             "with ac, each checkpointed block's forward but its last linear layer (torch's non-reentrant "
             "checkpoint stops once backward has what it needs) and its attention; with ac-op, the linear "
             "layers torchtitan's policy does not save (every second mm, and biased ones, run as addmm), "
             "attention saved; 2 FLOPs per weight, adapters included; the embeddings and the head are "
             "not recomputed")


def op_recomputed_weights(spec: RunSpec) -> int:
    """Weights of one block's linear layers that torchtitan's op-level policy recomputes (harness/
    recompute.py): in forward order, a biased layer (aten.addmm, not in the save list) and every second
    aten.mm; never the last, whose output backward does not need."""
    layers = block_matmuls(spec)
    out, mm = 0, 0
    for weights, biased in layers[:-1]:
        mm += not biased
        if biased or mm % 2 == 0:
            out += weights
    return out


def hardware_flops_factor(spec: RunSpec, flops_per_token: float) -> float | None:
    """Hardware FLOPs / model FLOPs (``flops_per_token``) under the variant's recompute, 1 without;
    None for ac-op with adapters (the policy's mm count then runs over the adapters' matmuls too: not
    counted here). Held to torch's FlopCounterMode on real backward passes (tests/unit/test_flops.py):
    the recompute skips each block's last linear layer (MLP down projection), whose output backward
    does not need, and never touches the head, so ac is not the 4/3 of a full extra forward."""
    recompute = Recompute.of(spec.variant_parts())
    blocks = recompute.blocks(spec.n_layer)
    if not blocks:
        return 1.0
    if recompute.policy == "op":
        if spec.workload != "pretrain":
            return None
        return 1.0 + 2.0 * blocks * op_recomputed_weights(spec) / flops_per_token
    counts = param_counts(spec)
    last = spec.ffn_width * spec.n_embd  # the MLP's down projection: c_proj (gpt), down_proj
    adapters = adapter_params(spec) // spec.n_layer if spec.workload != "pretrain" else 0
    per_block = counts.block_linear - last + adapters
    attention = 4.0 * blocks * spec.n_head * (spec.n_embd // spec.n_head) * spec.seq_len
    return 1.0 + (2.0 * blocks * per_block + attention) / flops_per_token
