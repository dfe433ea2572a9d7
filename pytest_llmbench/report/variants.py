"""Variants against their base: what each knob (activation checkpointing, offload, bucket
size, gradient compression, bf16 reduction, no resharding, torch.compile) buys and costs, measured
on the same profile, sequence length and world size as the plain strategy.

A variant's speed is its tokens/s over the base's, called a difference only under the
report's lead rule (findings.lead: the interval of the ratio over trials, or the step-time
spread with one trial); peak memory under MEMORY_TIE. Its loss gap is the largest absolute
difference between its loss curve and the base's over the run (same seed, same batches): about
1e-6 for exact variants, more for lossy ones (powersgd, bf16-reduce), so nobody buys speed with
a silently worse model.
"""

from __future__ import annotations

from typing import Any

from pytest_llmbench.report.findings import MEMORY_TIE, lead
from pytest_llmbench.report.load import Loaded, keys


def variant_rows(loaded: Loaded) -> list[dict[str, Any]]:
    """One row per finished variant case that has a finished base case to compare with: the same
    case (RunSpec.identity, same profile and device) with variant base."""
    ok = loaded.frame[loaded.frame.status == "ok"]
    rows = []
    for _, row in ok[ok.variant != "base"].iterrows():
        base = keys(loaded.results[row.run_id].spec.replace(variant="base"), row.device_key)
        match = ok[(ok.profile == row.profile) & (ok.case_key == base["case_key"])]
        if not match.empty:
            rows.append(_compare(loaded, row, match.iloc[0]))
    return rows


def _compare(loaded: Loaded, row: Any, base: Any) -> dict[str, Any]:
    speed = row.tokens_per_s / base.tokens_per_s
    tie, _, why = lead("tokens_per_s", True, *((row, base) if speed >= 1 else (base, row)))
    memory = row.peak_memory_gib / base.peak_memory_gib
    losses, base_losses = loaded.results[row.run_id].losses, loaded.results[base.run_id].losses
    steps = min(len(losses), len(base_losses))
    gap = max((abs(a - b) for a, b in zip(losses[:steps], base_losses[:steps], strict=True)), default=None)
    return {"profile": row.profile, "seq_len": row.seq_len, "world_size": row.world_size,
            "strategy": base.strategy, "strategy_name": row.strategy_name, "variant": row.variant,
            "speed": speed, "speed_text": f"{speed:.2f}x" + (" (no significant difference)" if tie else ""),
            "speed_why": why, "memory": memory,
            "memory_text": f"{memory:.2f}x" + (" (within noise)" if abs(1 - memory) < MEMORY_TIE else ""),
            "overhead": row.step_overhead, "base_overhead": base.step_overhead,
            "loss_gap": gap, "loss_last_delta": (losses[-1] - base_losses[-1]) if steps else None,
            **_compile(row, base, faster=speed > 1 and not tie)}


def _compile(row: Any, base: Any, *, faster: bool) -> dict[str, Any]:
    """For a compiled variant: its compile time, recompiles, graph breaks, inductor cache hits, and the
    optimizer steps after which compiling has paid for itself (compile_s over the median step time it
    saves; None unless the compiled case is faster under the speed column's lead rule)."""
    if "compile" not in str(row.variant).split("+"):
        return {"compiled": False}
    saved = base.step_time_median_s - row.step_time_median_s
    pays = faster and saved > 0 and row.compile_s == row.compile_s  # (NaN: no compile time recorded)
    return {"compiled": True, "compile_s": row.compile_s, "recompiles": row.recompiles,
            "graph_breaks": row.graph_breaks, "compile_cache_hits": row.compile_cache_hits,
            "pays_off_after": row.compile_s / saved if pays else None}
