"""Stored results -> one pandas DataFrame, one row per case (the latest run of each).

Scaling efficiency is recomputed here from the rows actually reported, so every
efficiency in the report divides by a baseline that is in the same report.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.result import GIB, BenchResult, ResultError, scaling_efficiency
from pytest_llmbench.store import ResultStore, read_file

# Columns of metrics.csv, in order. Units are in the names.
COLUMNS = [
    "profile", "strategy", "world_size", "nnodes", "seq_len", "model", "n_params", "dtype",
    "micro_batch", "grad_accum", "tokens_per_step", "status", "tokens_per_s",
    "tokens_per_s_per_device", "step_time_mean_s", "step_time_median_s", "step_time_p90_s",
    "step_time_p99_s", "step_time_stddev_s", "step_time_min_s", "step_time_max_s",
    "peak_memory_gib", "peak_memory_kind", "mfu", "tflops_per_device", "comm_overhead",
    "scaling_efficiency", "scaling_baseline_world_size", "usd_per_device_hour", "tokens_per_usd",
    "usd_per_million_tokens", "loss_first", "loss_last", "launch_overhead_s", "wall_time_s",
    "device_name", "torch", "deepspeed", "git_commit", "run_id", "created_utc", "error",
    # the original system's columns, so its users can diff (decimal GB, percent)
    "tokens_per_sec", "mean_step_time_sec", "peak_vram_gb", "scaling_efficiency_pct",
]
GROUP = ["profile", "strategy", "seq_len", "model", "dtype", "micro_batch", "grad_accum", "device_name"]


@dataclass
class Loaded:
    frame: pd.DataFrame
    results: dict[str, BenchResult] = field(default_factory=dict)  # run_id -> result (reported rows)
    skipped_files: list[str] = field(default_factory=list)
    superseded: int = 0  # older runs of a case not reported
    efficiency_reasons: dict[str, str] = field(default_factory=dict)  # run_id -> why empty
    sessions: list[str] = field(default_factory=list)  # the sessions reported; empty: all of them


class ReportError(ValueError):
    """The report was asked for something the store does not hold."""


def load_results(output: Path, sessions: Sequence[str] = ()) -> Loaded:
    """Every result stored under ``output`` (or only those of ``sessions``), the latest run
    of each case. Unreadable files are skipped with a warning and listed in the caveats."""
    store = ResultStore(output)
    stored = store.sessions()
    missing = [s for s in sessions if s not in stored]
    if missing:
        raise ReportError(f"session(s) {', '.join(missing)} not found under {store.results_dir}; "
                          f"stored sessions: {', '.join(stored) or 'none'}")
    entries: list[tuple[str, BenchResult]] = []
    skipped = []
    for session in sessions or stored:
        for path in sorted((store.results_dir / session).glob("*.json")):
            try:
                entries.append(read_file(path))
            except ResultError as exc:
                skipped.append(f"{path}: {exc}")
                warnings.warn(f"llmbench report: skipping {path}: {exc}", stacklevel=2)
    latest: dict[tuple, tuple[str, BenchResult]] = {}
    for profile, result in sorted(entries, key=lambda e: e[1].created_utc):
        latest[(profile, _case_key(result))] = (profile, result)
    rows = [_row(profile, result) for profile, result in latest.values()]
    frame = pd.DataFrame(rows, columns=COLUMNS[:-4]) if rows else pd.DataFrame(columns=COLUMNS)
    loaded = Loaded(frame=frame, results={r.run_id: r for _, r in latest.values()},
                    skipped_files=skipped, superseded=len(entries) - len(latest), sessions=list(sessions))
    if rows:
        _add_efficiency(loaded)
        _add_original_columns(loaded.frame)
        loaded.frame = loaded.frame.sort_values(["profile", "seq_len", "strategy", "world_size"],
                                                ignore_index=True)
    return loaded


def _case_key(result: BenchResult) -> str:
    spec = result.spec.to_dict()
    spec.pop("extra", None)
    return json.dumps(spec, sort_keys=True) + str(result.env.get("device_name"))


def _row(profile: str, r: BenchResult) -> dict:
    s, m = r.spec, r.metrics
    row = {k: m.get(k) for k in COLUMNS if k in m}
    row.update(profile=profile, strategy=s.strategy, world_size=s.world_size, nnodes=s.nnodes,
               seq_len=s.seq_len, model=s.model, n_params=r.n_params, dtype=s.dtype,
               micro_batch=s.micro_batch, grad_accum=s.grad_accum, tokens_per_step=s.tokens_per_step,
               status=r.status, device_name=r.env.get("device_name"), torch=r.env.get("torch"),
               deepspeed=r.env.get("deepspeed"), git_commit=r.env.get("git_commit"),
               run_id=r.run_id, created_utc=r.created_utc, wall_time_s=r.wall_time_s,
               error=(r.error or "").splitlines()[0][:200] if r.error else None,
               scaling_efficiency=None, scaling_baseline_world_size=None)
    return row


def _add_efficiency(loaded: Loaded) -> None:
    """E(N) = tps(N) / (N / N0 x tps(N0)) with N0 the smallest ok world size of the group,
    which must be the stored results' baseline world size (normally 1)."""
    frame = loaded.frame
    for _, group in frame.groupby(GROUP, dropna=False):
        ok = group[group.status == "ok"]
        wanted = {loaded.results[rid].metrics.get("scaling_baseline_world_size") for rid in group.run_id}
        n0 = min((w for w in wanted if w), default=1)
        base = ok[ok.world_size == n0]
        for idx, row in group.iterrows():
            if row.status != "ok":
                loaded.efficiency_reasons[row.run_id] = f"case did not finish ({row.status})"
            elif base.empty:
                loaded.efficiency_reasons[row.run_id] = (f"no successful ws{n0} baseline of this case "
                                                         f"in the results; never assumed 100%")
            else:
                b = base.iloc[0]
                frame.loc[idx, "scaling_efficiency"] = scaling_efficiency(
                    tokens_per_s=row.tokens_per_s, world_size=row.world_size,
                    baseline_tokens_per_s=b.tokens_per_s, baseline_world_size=n0)
                frame.loc[idx, "scaling_baseline_world_size"] = n0


def _add_original_columns(frame: pd.DataFrame) -> None:
    frame["tokens_per_sec"] = frame["tokens_per_s"]
    frame["mean_step_time_sec"] = frame["step_time_mean_s"]
    frame["peak_vram_gb"] = frame["peak_memory_gib"] * GIB / 1e9
    frame["scaling_efficiency_pct"] = 100.0 * pd.to_numeric(frame["scaling_efficiency"])
