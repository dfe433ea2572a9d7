"""Threshold verdicts alone (pytest_llmbench/verdicts.py): each holds, fails with the words CI
shows, or says why it could not decide."""

import dataclasses
import math
import random

import pytest

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


def test_peak_memory_fails_only_when_confidently_above_the_budget():
    """One trial: its declared noise (1%) is the spread, so 0.5% over passes and 25% over fails;
    trials that straddle the budget pass, trials all clearly over it fail, naming the bound."""
    assert verdicts.peak_memory([result(peak=1.005)], PROFILE) is None  # within the memory noise
    assert verdicts.peak_memory([result(peak=0.9), result(peak=1.0)], PROFILE) is None
    assert verdicts.peak_memory([result(peak=0.9), result(peak=1.25)], PROFILE) is None  # not sure
    one = verdicts.peak_memory([result(peak=1.25)], PROFILE)
    assert one.startswith("peak memory 1.250 GiB exceeds the tinycpu budget of 1 GiB (cpu_peak_rss; mean of "
                          "1 trial(s), largest 1.250): its one-sided 98% lower bound 1.2")
    assert "spread: declared memory noise (memory_noise_cv) cv 1% (one trial a side)" in one
    three = verdicts.peak_memory([result(peak=p) for p in (1.10, 1.11, 1.09)], PROFILE)
    assert "mean of 3 trial(s), largest 1.110" in three and "pooled over the trials (2 degrees" in three
    no_budget = dataclasses.replace(PROFILE, max_peak_memory_gib=None)
    assert verdicts.peak_memory([result(peak=99.0)], no_budget) is None


@pytest.mark.parametrize(("cv", "n"), [(0.002, 1), (0.002, 3), (0.01, 1), (0.01, 3), (0.03, 1), (0.03, 5)])
def test_the_memory_budget_meets_its_error_budget_on_simulated_trials(cv, n):
    """Seeded lognormal peaks with the profile's declared noise: a case exactly at the budget fails at
    most 2% (+ simulation error) of the time; one 10% over it is caught at least 80%. (At 3% noise
    three trials are too few: their t on 2 degrees of freedom catches 72%; five catch it.) The old
    rule (the largest trial above the budget) fails half the cases at the budget or more."""
    rng = random.Random(f"memory-{cv}-{n}")
    profile = dataclasses.replace(PROFILE, memory_noise_cv=cv)

    def fails(true_peak: float) -> bool:
        peaks = [true_peak * math.exp(rng.gauss(0, math.log1p(cv))) for _ in range(n)]
        return verdicts.peak_memory([result(peak=p) for p in peaks], profile) is not None

    runs = 1000
    assert sum(fails(1.0) for _ in range(runs)) / runs <= 0.02 + 0.015
    assert sum(fails(1.10) for _ in range(runs)) / runs >= 0.80
    old = sum(max(math.exp(rng.gauss(0, math.log1p(cv))) for _ in range(n)) > 1.0 for _ in range(runs))
    assert old / runs >= 0.45


def test_scaling_below_its_floor_or_unknown_fails_and_no_floor_never_does():
    """``fails`` and the words come from gate_rules.floor_check (tests/unit/test_stats.py)."""
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
    assert "falls back to TCP sockets" in text and "extra_resources" in text  # the likely cause, named
