"""Stored results -> pandas DataFrames: one row per trial, and one row per case (aggregate.py).

Each case reports the trials of its latest session (the session of its newest stored run;
the latest run of each trial index there). Scaling efficiency is recomputed here from the
rows actually reported, so every efficiency in the report divides by a baseline that is in
the same report.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import metrics
from harness.result import GIB, BenchResult, ResultError
from harness.spec import RunSpec
from pytest_llmbench.report import aggregate
from pytest_llmbench.store import (
    ResultStore,
    latest_per_trial,
    launcher_of,
    metric_facts,
    read_facts,
    read_file,
    result_files,
    strategy_facts,
)

# Columns of metrics.csv (one row per trial), in order: what the case is, every metric of the metric
# table (harness/metrics.py, units in the names), where and when it ran, the case's aggregate over
# its trials (``case_*``, the same on each of its rows), and the original system's columns so its
# users can diff (decimal GB, percent). ``strategy`` is the strategy as run (RunSpec.run_as:
# ``fsdp+ac`` for a variant, ``qlora-ddp`` for a fine-tuning workload; ``variant`` and ``workload``
# alone say which), with the launcher when it is not the local one: ``ddp (slurm)`` sits beside
# ``ddp`` in every table, a case of its own.
CASE = ["profile", "strategy", "workload", "variant", "launcher", "world_size", "nnodes", "seq_len", "trial",
        "model",
        "dtype", "micro_batch", "grad_accum", "scaling", "status"]
# launch_mode: "warm" (ranks that served earlier cases: launch_case_index is this case's place in
# its pool), "fresh" (one torchrun for the case), empty where not recorded (launchers/local/warm.py)
RUN = ["device_name", "torch", "deepspeed", "git_commit", "run_id", "created_utc", "launch_mode",
       "launch_case_index", "error"]
ORIGINAL = ["tokens_per_sec", "mean_step_time_sec", "peak_vram_gb", "scaling_efficiency_pct"]


def columns() -> list[str]:
    """The CSV's columns, the plugins' metrics included."""
    return [*CASE, *metrics.names(), *RUN, *aggregate.CASE_COLUMNS, *ORIGINAL]


@dataclass
class Loaded:
    frame: pd.DataFrame  # one row per case, its trials aggregated
    trials: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per trial: metrics.csv
    results: dict[str, BenchResult] = field(default_factory=dict)  # run_id -> result (reported trials)
    skipped_files: list[str] = field(default_factory=list)
    superseded: int = 0  # older runs of a case (or of one of its trials) not reported
    efficiency_reasons: dict[str, str] = field(default_factory=dict)  # run_id -> why empty
    sessions: list[str] = field(default_factory=list)  # the sessions reported; empty: all of them
    probes: list[tuple[str, BenchResult]] = field(default_factory=list)  # (profile, collectives probe)
    scale: object = None  # the projection and memory plan (report/scale.py), once computed
    # {strategy: {"color", "doc"}} the reported sessions recorded (a plugin's strategy, read without it)
    strategy_facts: dict[str, dict[str, str]] = field(default_factory=dict)


class ReportError(ValueError):
    """The report was asked for something the store does not hold."""


def _stored_metrics(recorded: dict[str, dict]) -> None:
    """A plugin metric a session recorded and this process lacks (its plugin absent): a row whose value
    is the one stored with each result, so the report's columns are the session's."""
    known = set(metrics.names())
    for name, row in recorded.items():
        if name not in known:
            summary = tuple(row["summary"]) if row["summary"] else None
            metrics.register(metrics.Metric(name, **{**row, "summary": summary},
                                            derive=lambda result, name=name: result.metrics.get(name)))


def load_results(output: Path, sessions: Sequence[str] = ()) -> Loaded:
    """Every result stored under ``output`` (or only those of ``sessions``), the latest run
    of each case. Unreadable files are skipped with a warning and listed in the caveats."""
    store = ResultStore(output)
    stored = store.sessions()
    missing = [s for s in sessions if s not in stored]
    if missing:
        raise ReportError(f"session(s) {', '.join(missing)} not found under {store.results_dir}; "
                          f"stored sessions: {', '.join(stored) or 'none'}")
    entries: list[tuple[str, str, BenchResult]] = []  # (session, profile, result)
    recorded: dict[str, dict[str, str]] = {}
    skipped = []
    for session in sessions or stored:
        folder = store.results_dir / session
        facts = read_facts(folder)  # one read a session
        recorded.update(strategy_facts(folder, facts))
        _stored_metrics(metric_facts(folder, facts))
        for path in result_files(store.results_dir / session):
            try:
                entries.append((session, *read_file(path)))
            except ResultError as exc:
                skipped.append(f"{path}: {exc}")
                warnings.warn(f"llmbench report: skipping {path}: {exc}", stacklevel=2)
    slots = launch_slots(entries)
    probes = [(p, r) for _, p, r in entries if r.spec.benchmark == "collectives"]
    entries = [e for e in entries if e[2].spec.benchmark != "collectives"]
    chosen = _latest_trials(entries)
    loaded = Loaded(frame=pd.DataFrame(columns=columns()), results={r.run_id: r for _, r, _ in chosen},
                    skipped_files=skipped, superseded=len(entries) - len(chosen), sessions=list(sessions),
                    probes=_latest_probes(probes), strategy_facts=recorded)
    if not chosen:
        loaded.trials = pd.DataFrame(columns=columns())
        return loaded
    trials = pd.DataFrame([_row(profile, result) | keys(result.spec, device)
                           | {"launch_slot": slots[result.run_id]} for profile, result, device in chosen])
    aggregate.add_efficiency(trials, loaded.results, {}, per_trial=True)
    frame = aggregate.cases(trials, loaded.results)
    aggregate.add_efficiency(frame, loaded.results, loaded.efficiency_reasons, per_trial=False)
    aggregate.add_trial_lists(frame, trials)
    for part in (trials, frame):
        _add_original_columns(part)
    case_columns = frame[["profile", "case_key", *aggregate.CASE_COLUMNS]]
    trials = trials.drop(columns=aggregate.CASE_COLUMNS, errors="ignore").merge(case_columns,
                                                                                on=["profile", "case_key"])
    order = ["profile", "seq_len", "strategy", "world_size"]
    loaded.frame = frame.sort_values(order, ignore_index=True)
    loaded.trials = trials.sort_values([*order, "trial"], ignore_index=True)
    return loaded


def _latest_probes(probes: list[tuple[str, BenchResult]]) -> list[tuple[str, BenchResult]]:
    """The newest ok probe of each profile and world size (the newest failed one if none is ok)."""
    latest: dict[tuple[str, int], tuple[str, BenchResult]] = {}
    for profile, result in sorted(probes, key=lambda e: (e[1].ok, e[1].created_utc)):
        latest[(profile, result.spec.world_size)] = (profile, result)
    return [latest[k] for k in sorted(latest)]


def launch_slots(entries: list[tuple[str, str, BenchResult]]) -> dict[str, int]:
    """Each run's place (1, 2, ...) in its session's launch order, by the time it was stored: what a
    drift of the machine over the session saw of it (the Trials table's mean slot)."""
    by_session: dict[str, list[BenchResult]] = {}
    for session, _, result in entries:
        by_session.setdefault(session, []).append(result)
    return {r.run_id: place for runs in by_session.values()
            for place, r in enumerate(sorted(runs, key=lambda r: r.created_utc), 1)}


def keys(spec: RunSpec, device: str) -> dict[str, str]:
    """A row's identity columns: its device, its case (RunSpec.identity) and its scaling group
    (RunSpec.scaling_identity), each on that device: the same spec on another GPU is another case."""
    return {"device_key": device, "case_key": spec.identity() + device,
            "scaling_key": spec.scaling_identity() + device}


def _latest_trials(entries: list[tuple[str, str, BenchResult]]) -> list[tuple[str, BenchResult, str]]:
    """Per case, the trials of the session holding its newest run (the latest of each trial
    index), each with its device."""
    keyed = [(session, profile, result, (result.spec.identity(), _device(session, result, entries)))
             for session, profile, result in entries]
    newest: dict[tuple[str, tuple[str, str]], str] = {}
    for session, profile, _, key in sorted(keyed, key=lambda e: e[2].created_utc):
        newest[(profile, key)] = session
    chosen = []
    for (profile, key), session in newest.items():
        runs = [r for s, p, r, k in keyed if s == session and p == profile and k == key]
        chosen += [(profile, r, key[1]) for r in latest_per_trial(runs)]
    return chosen


def _device(session: str, result: BenchResult, entries: list[tuple[str, str, BenchResult]]) -> str:
    """The device a result ran on, and by which launcher when not the local one: the same spec on
    another GPU, or as a Slurm job, is another case. A run that failed before it saw its device
    takes the device of its session's other runs of that spec."""
    device = result.env.get("device_name") or next(
        (r.env["device_name"] for s, _, r in entries
         if s == session and r.env.get("device_name") and r.spec == result.spec), None)
    launcher = launcher_of(result)
    return str(device) if launcher == "local" else f"{device} via {launcher}"


def _row(profile: str, r: BenchResult) -> dict:
    s, m = r.spec, r.metrics
    row = {k: m.get(k) for k in columns()}
    # results stored before these metrics existed (schema 2): the same derivations, from their values
    if row["samples_per_s"] is None and m.get("tokens_per_s"):
        row["samples_per_s"] = m["tokens_per_s"] / s.seq_len
    if row["usd_per_thousand_samples"] is None and m.get("tokens_per_usd"):
        row["usd_per_thousand_samples"] = 1e3 * s.seq_len / m["tokens_per_usd"]
    if row["n_trainable_params"] is None and s.workload == "pretrain":
        row["n_trainable_params"] = r.n_params
    if row["step_overhead"] is None:  # schema 3 and before: named comm_overhead, though it was this
        row["step_overhead"] = m.get("comm_overhead")
    launcher = launcher_of(r)
    row.update(profile=profile, strategy=s.run_as if launcher == "local" else f"{s.run_as} ({launcher})",
               strategy_name=s.strategy, case_id=s.case_id, variant=s.variant, launcher=launcher,
               workload=s.workload,
               world_size=s.world_size, nnodes=s.nnodes, seq_len=s.seq_len, model=s.model,
               n_params=r.n_params, dtype=s.dtype, micro_batch=s.micro_batch, grad_accum=s.grad_accum,
               tokens_per_step=s.tokens_per_step,
               status=r.status, device_name=r.env.get("device_name"), torch=r.env.get("torch"),
               deepspeed=r.env.get("deepspeed"), git_commit=r.env.get("git_commit"),
               run_id=r.run_id, created_utc=r.created_utc, wall_time_s=r.wall_time_s, trial=r.trial,
               launch_mode=r.launch.get("mode"), launch_case_index=r.launch.get("case_index"),
               error=(r.error or "").splitlines()[0][:200] if r.error else None,
               scaling_efficiency=None, scaling_baseline_world_size=None, scaling=s.scaling)
    return row


def _add_original_columns(frame: pd.DataFrame) -> None:
    frame["tokens_per_sec"] = frame["tokens_per_s"]
    frame["mean_step_time_sec"] = frame["step_time_mean_s"]
    frame["peak_vram_gb"] = frame["peak_memory_gib"] * GIB / 1e9
    frame["scaling_efficiency_pct"] = 100.0 * pd.to_numeric(frame["scaling_efficiency"])
