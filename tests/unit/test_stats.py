"""Statistics over trials (pytest_llmbench/stats.py) on constructed data and hand-worked numbers."""

import math
import random

import pytest
from scipy import stats as sp

from pytest_llmbench.stats import compare, gate, ratio_interval, summary, trials_needed


def test_summary_t_interval_worked_by_hand():
    s = summary([10.0, 12.0, 14.0])
    assert (s.n, s.mean, s.median, s.stdev) == (3, 12.0, 12.0, 2.0)
    assert s.cv == pytest.approx(1 / 6)
    # t(0.975, 2 df) = 4.302653; half width = 4.302653 x 2 / sqrt(3) = 4.968275
    assert (s.low, s.high) == (pytest.approx(12 - 4.968275, abs=1e-5), pytest.approx(12 + 4.968275, abs=1e-5))
    # and scipy's own interval of the mean agrees
    assert (s.low, s.high) == pytest.approx(sp.t.interval(0.95, 2, loc=12, scale=2 / math.sqrt(3)))


def test_one_trial_has_no_interval():
    s = summary([5.0])
    assert (s.n, s.mean, s.stdev, s.cv, s.low, s.high) == (1, 5.0, None, None, None, None)
    r = ratio_interval([5.0], [4.0, 4.1])
    assert r.value == pytest.approx(5 / 4.05) and r.low is None and "one trial" in r.method
    with pytest.raises(ValueError):
        summary([])


def test_ratio_interval_with_a_constant_side_is_the_t_interval_of_the_other():
    # b has no spread: se = cv_a / sqrt(n_a), df = n_a - 1 (Welch reduces to it)
    a, b = [100.0, 102.0, 98.0, 104.0, 96.0], [80.0] * 4
    r = ratio_interval(a, b)
    cv = summary(a).stdev / 100
    half = sp.t.ppf(0.975, 4) * cv / math.sqrt(5)
    assert r.value == pytest.approx(1.25)
    assert (r.low, r.high) == (pytest.approx(1.25 * math.exp(-half)), pytest.approx(1.25 * math.exp(half)))


def test_ratio_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng, hits, reps = random.Random(7), 0, 2000
    for _ in range(reps):  # 3 trials a side, 5% trial-to-trial noise, true ratio 1.10
        a = [rng.gauss(110, 5.5) for _ in range(3)]
        b = [rng.gauss(100, 5.0) for _ in range(3)]
        r = ratio_interval(a, b)
        hits += r.low <= 1.10 <= r.high
    assert 0.93 <= hits / reps <= 0.975


def test_a_clear_difference_is_called_and_an_overlap_is_not():
    fast, slow = [120.0, 121.0, 119.5], [100.0, 101.0, 99.0]
    assert compare(fast, slow) == "higher" and compare(slow, fast) == "lower"
    overlapping = [104.0, 96.0, 101.0]
    assert compare(overlapping, slow) == "same"
    # a real but tiny lead (1%) is within the 2% noise threshold: no winner
    assert compare([101.0, 101.1, 100.9], [100.0, 100.1, 99.9]) == "same"
    # one trial a side: the point ratio against the same threshold
    assert compare([110.0], [100.0]) == "higher" and compare([101.0], [100.0]) == "same"


def test_the_gate_passes_fails_or_is_inconclusive():
    old = [100.0, 101.0, 99.0]
    passed = gate([99.0, 100.0, 98.5], old, allowed_drop=0.05)
    assert passed.outcome == "pass" and passed.ratio.low >= 0.95
    failed = gate([80.0, 81.0, 79.5], old, allowed_drop=0.05)
    assert failed.outcome == "fail" and failed.ratio.high < 0.95
    unsure = gate([90.0, 99.0, 94.0], old, allowed_drop=0.05)
    assert unsure.outcome == "inconclusive" and unsure.ratio.low < 0.95 < unsure.ratio.high
    assert "straddles" in unsure.text
    single = gate([90.0], [100.0], allowed_drop=0.05)
    assert single.outcome == "fail" and "single runs" in single.text
    assert gate([97.0], [100.0], allowed_drop=0.05).outcome == "pass"


def test_trials_needed_worked_by_hand_for_the_reports_rule():
    # a lead is called only when the interval clears 1 + 2%: the gap is ln 1.05 - ln 1.02 = 0.02899;
    # at n = 48, t(0.975, 94) = 1.9855: 2 (1.9855 + 0.8416)^2 0.05^2 / 0.02899^2 = 47.6 -> 48
    assert trials_needed(cv=0.05, difference=0.05) == 48
    assert trials_needed(cv=0.001, difference=0.05) == 2
    assert trials_needed(cv=0.05, difference=0.02) is None  # within the noise: never called a lead


def test_trials_needed_is_what_the_rule_needs_in_a_seeded_simulation():
    """Lognormal trials 5% apart at cv 5%: at the advised 48 trials a side compare() calls the lead
    about 80% of the time; at the 16 the plain two-sample formula advised, about a third."""
    rng = random.Random(20261123)

    def called(n: int, runs: int = 1000) -> float:
        hits = 0
        for _ in range(runs):
            a = [1.05 * math.exp(rng.gauss(0, 0.05)) for _ in range(n)]
            b = [math.exp(rng.gauss(0, 0.05)) for _ in range(n)]
            hits += compare(a, b) == "higher"
        return hits / runs

    assert 0.75 <= called(trials_needed(cv=0.05, difference=0.05)) <= 0.90
    assert called(16) <= 0.45
