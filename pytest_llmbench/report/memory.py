"""The Memory by category section: for each case run with --llmbench-memory, the bytes PyTorch's
own tracker saw at the peak on the rank with the largest total (harness/instruments/memory.py), beside the
planner's terms for the same shape (pytest_llmbench/planner/memory.py) where the two mean the same thing:
weights, gradients, the gradient buckets, optimizer state."""

from __future__ import annotations

from typing import Any

from pytest_llmbench.planner import memory as plan
from pytest_llmbench.report.load import Loaded

MIB = 2**20
# the tracker's categories, grouped into the columns the section shows (FSDPMemTracker's names and
# MemTracker's)
COLUMNS = {
    "parameters": ("parameter", "sharded_param"),
    "gathered": ("unsharded_param", "all_gather"),
    "gradients": ("gradient", "sharded_grad", "unsharded_grad", "reduce_scatter"),
    "optimizer": ("optstate",),
    "activations": ("activation",),
    "temporaries": ("temp",),
    "other": ("buffer", "other", "inputs"),
}
# the planner's terms that mean what a column means; its gradient buckets apart: DeepSpeed's are
# tensors the tracker sees (a bucket the gradients view counts as gradients, ZeRO-2's second as
# temporaries), DDP's reducer buckets, made in C++, only once backward writes into them (mul_out),
# as temporaries
PLANNED = {"parameters": ("weights",), "gradients": ("gradients",), "buckets": ("grad buckets",),
           "optimizer": ("optimizer",)}


def memory_rows(loaded: Loaded) -> list[dict[str, Any]]:
    """A row per finished case whose ranks ran the tracker (its latest trial): each column in bytes
    on the rank with the largest tracked total, the total, the planner's weights, gradients and
    optimizer at the case's shape, and ``partitions``: what DeepSpeed's optimizer made before the
    tracker started (the strategy row's held, harness/strategies.py; None for the other strategies); a
    case whose strategy cannot be tracked gets the reason."""
    rows = []
    ok = loaded.frame[loaded.frame.status == "ok"]
    for row in ok.sort_values(["profile", "seq_len", "world_size", "strategy"]).itertuples():
        result = loaded.results[row.run_id]
        tracked = [t for t in result.instruments.get("memory", []) if t]
        if not tracked:
            continue
        base = {"profile": row.profile, "strategy": row.strategy, "world_size": row.world_size,
                "seq_len": row.seq_len}
        seen = [t for t in tracked if "peak_bytes" in t]
        if not seen:
            rows.append(base | {"tracker": "-", "why_empty": tracked[0].get("error", "not tracked")})
            continue
        largest = max(seen, key=lambda t: t["peak_bytes"].get("total", 0))
        peak = largest["peak_bytes"]
        columns = {name: sum(peak.get(k, 0) for k in keys) for name, keys in COLUMNS.items()}
        held = largest.get("held_bytes")
        total = peak.get("total", sum(columns.values()))
        if held and largest.get("held_in_peak"):  # handed to the tracker, counted in its Other
            columns["other"] -= sum(held.values())
        elif held:  # runs before harness/instruments/memory.py handed them over: the total without them
            total += sum(held.values())
        both = plan.of_run(result.spec)
        terms = max(both, key=lambda e: e.total).by_category() if both else {}  # the larger moment
        rows.append(base | {"tracker": largest["tracker"], "why_empty": "", **columns,
                            "total": total,
                            "partitions": sum(held.values()) if held else None,
                            **{f"planned_{name}": sum(terms.get(t, 0.0) for t in names) if terms else None
                               for name, names in PLANNED.items()}})
    return rows
