"""The Trace section: for each case traced with --llmbench-trace, what its traced steps spent on
compute, communication, communication under compute and idle (harness/instruments/trace.py, mean over ranks),
beside the subtraction-based overheads the report derives from the compute-only probe, and the
ops that took the most time."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pytest_llmbench.report.load import Loaded

PARTS = ("step_s", "compute_s", "comm_s", "hidden_comm_s", "exposed_comm_s", "idle_s")


def trace_rows(loaded: Loaded) -> list[dict[str, Any]]:
    """A row per traced finished case (its latest trial): each part in seconds, mean over ranks;
    the shares; the measured step (median) and the probe-based overheads; rank 0's top ops."""
    rows = []
    ok = loaded.frame[loaded.frame.status == "ok"]
    for row in ok.sort_values(["profile", "seq_len", "world_size", "strategy"]).itertuples():
        result = loaded.results[row.run_id]
        traces = [t for t in result.instruments.get("trace", []) if t]
        if not traces:
            continue
        mean = {k: statistics.fmean(t[k] for t in traces) for k in PARTS}
        m = result.metrics
        rows.append({
            "profile": row.profile, "strategy": row.strategy, "world_size": row.world_size,
            "seq_len": row.seq_len, **mean, "ranks": len(traces), "steps": len(traces[0]["steps"]),
            "measured_step_s": m.get("step_time_median_s"), "exposed_share": m.get("trace_exposed_comm"),
            "hidden_share": m.get("trace_comm_hidden"), "idle_share": m.get("trace_idle"),
            "step_overhead": m.get("step_overhead"), "probe_exposed_comm": m.get("exposed_comm"),
            "folder": str(Path(traces[0]["file"]).parent), "comm_source": traces[0].get("comm_source", ""),
            "top_ops": traces[0].get("top_ops", []), "top_ops_by": traces[0].get("top_ops_by", "")})
    return rows
