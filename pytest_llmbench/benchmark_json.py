"""pytest-benchmark integration: a case's measured step times become its stats.

One round per measured optimizer step of the trial, so ``--benchmark-autosave`` /
``--benchmark-json`` write files that ``pytest-benchmark compare`` reads and ``--benchmark-compare-fail``
gates on; the BenchResult metrics go to ``extra_info``. pytest-benchmark has no public
API to feed externally measured times, so this module is the one place that uses its
fixture's ``_make_stats`` (tested end to end in tests/plugin).

With several trials each trial of a case is its own test item (``...-trialK``) and so its own
benchmark entry; the last trial's entry also carries the case's aggregate over its trials in
``extra_info`` (``trials_<metric>_{mean,median,low,high,cv}``).
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.result import BenchResult


def record(request: pytest.FixtureRequest, case: Any, result: BenchResult) -> None:
    if not request.config.pluginmanager.hasplugin("benchmark"):
        return
    bench = request.getfixturevalue("benchmark")
    if getattr(bench, "disabled", False):
        return
    bench.group = (f"{case.profile.name} collectives" if case.spec.benchmark == "collectives"
                   else f"{case.profile.name} {case.spec.strategy} seq{case.spec.seq_len}")
    bench.extra_info.update(extra_info(result), llmbench_trial=case.trial, llmbench_trials=case.trials)
    if not result.ok or not result.step_times_s:
        bench.has_error = True  # pytest-benchmark leaves errored benchmarks out of its JSON
        bench._mode = "llmbench"  # and says nothing about an unused fixture
        return
    bench._mode = ("llmbench (the largest all_reduce, each operation timed alone)"
                   if case.spec.benchmark == "collectives" else "llmbench (measured optimizer steps)")
    stats = bench._make_stats(1)
    for seconds in result.step_times_s:
        stats.update(seconds)


def add_aggregate(request: pytest.FixtureRequest, info: dict[str, Any]) -> None:
    """The case's aggregate over its trials, on the last trial's benchmark entry."""
    if request.config.pluginmanager.hasplugin("benchmark"):
        bench = request.getfixturevalue("benchmark")
        if not getattr(bench, "disabled", False):
            bench.extra_info.update(info)


def extra_info(result: BenchResult) -> dict[str, Any]:
    """Flat, JSON-friendly metrics of a result for pytest-benchmark's ``extra_info``."""
    info: dict[str, Any] = {"llmbench_status": result.status, "llmbench_run_id": result.run_id}
    info.update({k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str, type(None)))})
    info.update({f"spec_{k}": v for k, v in result.spec.to_dict().items()
                 if isinstance(v, (int, float, str))})
    return info


def machine_info(records: list[tuple[str, BenchResult]]) -> dict[str, Any]:
    """GPU, driver, torch, DeepSpeed and NCCL versions from the first finished case."""
    for _, result in records:
        if result.ok:
            keys = ("device_name", "device_count", "driver", "torch", "deepspeed", "nccl", "cuda",
                    "host", "world_size")
            return {k: result.env.get(k) for k in keys}
    return {}
