"""Threshold verdicts alone (pytest_llmbench/verdicts.py): each holds, fails with the words CI
shows, or says why it could not decide."""

import dataclasses

from harness.bandwidth import OPS
from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench import verdicts
from tests.unit.test_trials import PROFILES

PROFILE = dataclasses.replace(PROFILES["tinycpu"], max_peak_memory_gib=1.0, min_scaling_efficiency={2: 0.8},
                              min_busbw_gbps=5.0)
SPEC = RunSpec(world_size=2)


def result(trial=1, status="ok", peak=0.5, error=None) -> BenchResult:
    metrics = {"peak_memory_gib": peak, "peak_memory_kind": "cpu_peak_rss"} if status == "ok" else {}
    return BenchResult(spec=SPEC, status=status, trial=trial, error=error, metrics=metrics)


def test_failed_trials_name_each_with_its_status_and_first_error_line():
    runs = [result(1), result(2, "oom", error="CUDA out of memory\ntraceback..."), result(3, "timeout")]
    assert verdicts.failed_trials(runs) == (
        "2 of 3 trials failed (trial 2: oom: CUDA out of memory; trial 3: timeout: ?)")
    assert verdicts.failed_trials(runs[:1]) is None


def test_peak_memory_fails_on_the_largest_trial_above_the_budget_only():
    assert verdicts.peak_memory([result(peak=0.9), result(peak=1.0)], PROFILE) is None  # at the budget holds
    text = verdicts.peak_memory([result(peak=0.9), result(peak=1.25)], PROFILE)
    assert text == "peak memory 1.250 GiB exceeds the tinycpu budget of 1 GiB (cpu_peak_rss)"
    no_budget = dataclasses.replace(PROFILE, max_peak_memory_gib=None)
    assert verdicts.peak_memory([result(peak=99.0)], no_budget) is None


def test_scaling_below_its_floor_or_unknown_fails_and_no_floor_never_does():
    """``fails`` and the words come from stats.floor_check (tests/unit/test_stats.py)."""
    assert verdicts.scaling(False, "0.850", 2, PROFILE) is None
    assert verdicts.scaling(True, "0.750 (upper bound 0.78, 3 trial(s))", 2, PROFILE) == (
        "scaling efficiency 0.750 (upper bound 0.78, 3 trial(s)) at ws2 is below the tinycpu threshold 0.8 "
        "with confidence")
    assert verdicts.scaling(None, "no baseline run", 2, PROFILE) == (
        "scaling efficiency unknown (no baseline run); the tinycpu profile requires >= 0.8")
    assert verdicts.scaling(True, "0.100", 4, PROFILE) is None  # no floor at ws4


def test_busbw_names_every_collective_below_the_floor():
    probe = RunSpec(benchmark="collectives", world_size=2)
    metrics = {"busbw_size_bytes": 1 << 20, **{f"busbw_gbps_{op}": 10.0 for op in OPS}}
    assert verdicts.busbw(BenchResult(spec=probe, status="ok", metrics=metrics), PROFILE) is None
    metrics.update(busbw_gbps_all_gather=1.5, busbw_gbps_broadcast=4.99)
    text = verdicts.busbw(BenchResult(spec=probe, status="ok", metrics=metrics), PROFILE)
    assert text.startswith("collectives-ws2: busbw at 1,048,576 bytes below the tinycpu threshold of 5 GB/s")
    assert "all_gather 1.5, broadcast 4.99 GB/s" in text and "all_reduce" not in text
