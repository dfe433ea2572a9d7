"""Stored cases for dashboards: ``llmbench-report --export bencher|pytorch-hud|pytest-benchmark``.

Each case the report reports (the latest session of each case, its trials aggregated: load.py) is
written once, with throughput, step time, peak memory, MFU, cost and scaling efficiency:

    bencher           Bencher Metric Format (bencher.dev/docs/reference/bencher-metric-format): one
                      benchmark per case, one measure per metric; tokens/s carries the trials' 95%
                      interval as lower_value/upper_value. ``bencher run --adapter json --file F``.
    pytorch-hud       PyTorch's OSS benchmark database records, one per case and metric (the v3
                      record of pytorch/pytorch's wiki "How to integrate with PyTorch OSS benchmark
                      database", as vLLM's benchmark_utils writes it): benchmark, model, metric with
                      its trials' values, runners.
    pytest-benchmark  pytest-benchmark's JSON (what --benchmark-json writes): each case's measured
                      step times as its stats (pytest-benchmark's own Stats), every metric in
                      ``extra_info``; ``pytest-benchmark compare F`` reads it.

A metric a case has no value for is left out of its entry, never written as 0; a case with none
(a failed case) is left out and counted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.transport import write_atomic

FORMATS = ("bencher", "pytorch-hud", "pytest-benchmark")
# metric column -> (Bencher measure slug, unit, higher is better)
MEASURES = {
    "tokens_per_s": ("tokens-per-s", "tokens/s", True),
    "step_time_median_s": ("step-time-median-s", "s", False),
    "peak_memory_gib": ("peak-memory-gib", "GiB", False),
    "mfu": ("mfu", "fraction of peak", True),
    "usd_per_million_tokens": ("usd-per-million-tokens", "USD", False),
    "scaling_efficiency": ("scaling-efficiency", "fraction", True),
}


class ExportError(ValueError):
    """Nothing to export, or an unknown format."""


def write(output: Path, fmt: str, sessions: Sequence[str] = (),
          to: Path | None = None) -> tuple[Path, int, int]:
    """Write the export of ``output``'s stored cases; (the file, cases written, cases left out)."""
    from pytest_llmbench.report.load import load_results

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    target = target_problem(Path(output), to) if to is not None else \
        Path(output) / "report" / "export" / f"{fmt}.json"  # write_atomic replaces a link, never follows it
    loaded = load_results(Path(output), sessions)
    cases = [row for _, row in loaded.frame.iterrows()]
    kept = [row for row in cases if _values(row)]
    if not kept:
        raise ExportError(f"no stored case under {output} has a value to export")
    names = distinct_names(kept)
    if fmt == "bencher":
        document: Any = bencher(kept, names)
    elif fmt == "pytorch-hud":
        document = pytorch_hud(kept, names)
    else:
        document = pytest_benchmark(kept, loaded.results, names)
    try:
        write_atomic(target, json.dumps(document, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise ExportError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target, len(kept), len(cases) - len(kept)


STORED = ("results", "runs", "benchmarks")  # OUTPUT's folders of stored results: never written by an export


def target_problem(output: Path, to: Path) -> Path:
    """``to``, checked as an export's target: a file that may be written and replaced, never a folder, a
    symlink, a path under a file or inside the results store; raises ExportError naming it."""
    to = Path(to)
    if to.is_symlink():
        raise ExportError(f"--export-to {to}: is a symlink (an export never writes through one)")
    if to.is_dir():
        raise ExportError(f"--export-to {to}: is a folder; name the file to write")
    resolved = to.resolve()
    for folder in STORED:
        if resolved.is_relative_to((output / folder).resolve()):
            raise ExportError(f"--export-to {to}: is inside the results store ({output / folder}); an export "
                              f"never overwrites a stored result")
    parent = next((p for p in [resolved.parent, *resolved.parent.parents] if p.exists()), Path("/"))
    if not parent.is_dir():
        raise ExportError(f"--export-to {to}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"--export-to {to}: {parent} is not writable")
    return to


def name(row) -> str:
    """The case as one name: profile/case id, and its launcher when not the local one."""
    where = "" if row["launcher"] in ("local", None, "") else f" ({row['launcher']})"
    return f"{row['profile']}/{row['case_id']}{where}"


def distinct_names(rows) -> list[str]:
    """Each row's name, made distinct as the report keeps cases distinct: the same case on two devices
    (two machines) is two entries, named by device; any still alike by their session's run id."""
    names = [name(row) for row in rows]
    for extra in ("device_name", "run_id"):
        seen: dict[str, int] = {}
        for n in names:
            seen[n] = seen.get(n, 0) + 1
        names = [f"{n} [{row.get(extra)}]" if seen[n] > 1 and row.get(extra) else n
                 for n, row in zip(names, rows, strict=True)]
    return names


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _values(row) -> dict[str, float]:
    return {m: v for m in MEASURES if (v := _number(row.get(m))) is not None}


def bencher(rows, names) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row, case in zip(rows, names, strict=True):
        measures = {}
        for metric, value in _values(row).items():
            entry = {"value": value}
            if metric == "tokens_per_s":
                low = _number(row.get("case_tokens_per_s_ci_low"))
                high = _number(row.get("case_tokens_per_s_ci_high"))
                if low is not None and high is not None:
                    entry.update(lower_value=low, upper_value=high)
            measures[MEASURES[metric][0]] = entry
        out[case] = measures
    return out


def pytorch_hud(rows, names) -> list[dict[str, Any]]:
    records = []
    for row, case in zip(rows, names, strict=True):
        for metric, value in _values(row).items():
            listed = row.get(f"trials_{metric}")  # each trial's value, where load.py keeps them
            each = [v for v in map(_number, listed if isinstance(listed, list) else []) if v is not None]
            records.append({
                "benchmark": {"name": "pytest-llmbench", "mode": "training", "dtype": row["dtype"],
                              "extra_info": {"profile": row["profile"], "strategy": row["strategy"],
                                             "world_size": int(row["world_size"]),
                                             "nnodes": int(row["nnodes"]), "seq_len": int(row["seq_len"]),
                                             "launcher": row["launcher"],
                                             "git_commit": row.get("git_commit"),
                                             "created_utc": row.get("created_utc")}},
                "model": {"name": row["model"], "type": row["workload"], "backend": row["strategy"]},
                "metric": {"name": metric, "benchmark_values": each or [value],
                           "extra_info": {"unit": MEASURES[metric][1],
                                          "higher_is_better": MEASURES[metric][2], "case": case}},
                "runners": [{"name": row.get("device_name") or "unknown",
                             "type": row.get("device_name") or "unknown",
                             "gpu_count": int(row["world_size"]),
                             "extra_info": {"torch": row.get("torch"), "deepspeed": row.get("deepspeed")}}],
            })
    return records


def pytest_benchmark(rows, results: dict, names) -> dict[str, Any]:
    import pytest_benchmark as package
    from pytest_benchmark.stats import Stats

    from pytest_llmbench.benchmark_json import extra_info, machine_info

    benchmarks, reported = [], []
    for row, case in zip(rows, names, strict=True):
        ids = row.get("run_ids")
        runs = [results[r] for r in (ids if isinstance(ids, list) else [row["run_id"]]) if r in results]
        times = [t for run in runs if run.ok for t in run.step_times_s]
        if not times:
            continue
        stats = Stats()
        for seconds in times:
            stats.update(seconds)
        reported += [(case, run) for run in runs]
        info = {**extra_info(runs[-1]), **{f"case_{m}": v for m, v in _values(row).items()}}
        benchmarks.append({
            "group": f"{row['profile']} {row['strategy']} seq{int(row['seq_len'])}", "name": case,
            "fullname": f"llmbench::{case}", "params": None, "param": None, "extra_info": info,
            "options": {"disable_gc": False, "timer": "llmbench (measured optimizer steps)",
                        "min_rounds": len(times), "max_time": 0, "min_time": 0, "warmup": False},
            "stats": {**stats.as_dict(), "data": list(times), "iterations": 1}})
    commits = {row.get("git_commit") for row in rows} - {None, ""}
    return {"machine_info": {"node": "", "processor": "", "machine": "", "python_compiler": "",
                             "python_implementation": "", "python_implementation_version": "",
                             "python_version": "", "python_build": [], "release": "", "system": "",
                             "cpu": {}, **machine_info(reported)},
            "commit_info": {"id": commits.pop() if len(commits) == 1 else None, "dirty": None,
                            "project": "pytest-llmbench"},
            "benchmarks": benchmarks, "datetime": datetime.now(UTC).isoformat(),
            "version": package.__version__}
