"""Trials: the matrix with a trial axis, its interleaved order, and what trials add up to."""

import math
import shutil
from pathlib import Path

import pytest

from harness.result import BenchResult
from pytest_llmbench import gate_rules, stats, trials
from pytest_llmbench.cases import Case, baseline_last, build_cases, interleave, round_orders
from pytest_llmbench.profiles import ProfileError, load_profile, load_profiles
from pytest_llmbench.session import BenchSession
from pytest_llmbench.settings import Settings
from pytest_llmbench.store import ResultStore, latest_per_trial, read_file

DATA = Path(__file__).resolve().parent.parent / "data"
PROFILES = load_profiles([str(DATA / "tinycpu.toml")])


def settings(**values) -> Settings:
    base = {"strategy": [], "variant": [], "workload": [], "world_size": [], "seq_len": [], "steps": None,
            "trials": None, "trace": False, "memory": False}
    return Settings({**base, **values})


def matrix(**values) -> list[Case]:
    return [c for c in build_cases(PROFILES, settings(**values)) if c.profile.name == "tinycpu"]


def test_each_case_is_built_once_per_trial_and_says_so_only_when_there_are_several():
    assert [c.id for c in matrix()] == ["tinycpu-ddp-ws1-seq64", "tinycpu-ddp-ws2-seq64",
                                        "tinycpu-zero2-ws1-seq64", "tinycpu-zero2-ws2-seq64"]
    three = matrix(trials=3, strategy=["ddp"], world_size=[2])
    assert [c.id for c in three] == [f"tinycpu-ddp-ws2-seq64-trial{k}" for k in (1, 2, 3)]
    assert three[1].label == "tinycpu-ddp-ws2-seq64 trial 2/3" and three[1].name == "tinycpu-ddp-ws2-seq64"
    assert three[1].at_world_size(1).id == "tinycpu-ddp-ws1-seq64-trial2"


def test_trials_run_in_rounds_with_balanced_groups_and_world_sizes_reversed_in_alternate_rounds():
    """Three rounds of two groups: forward, backward, backward (each group's slots sum to 1 or 2,
    the best an odd count allows); world sizes run down to the baseline in round 2 only, so the
    last round runs its baseline first."""
    order = [c.id.removeprefix("tinycpu-") for c in interleave(matrix(trials=3))]
    assert order == [
        "ddp-ws1-seq64-trial1", "ddp-ws2-seq64-trial1", "zero2-ws1-seq64-trial1", "zero2-ws2-seq64-trial1",
        "zero2-ws2-seq64-trial2", "zero2-ws1-seq64-trial2", "ddp-ws2-seq64-trial2", "ddp-ws1-seq64-trial2",
        "zero2-ws1-seq64-trial3", "zero2-ws2-seq64-trial3", "ddp-ws1-seq64-trial3", "ddp-ws2-seq64-trial3"]
    assert {(c.group, c.trial) for c in matrix(trials=3)} >= baseline_last(matrix(trials=3))
    assert sorted(trial for _, trial in baseline_last(matrix(trials=3))) == [2, 2]
    assert sorted(trial for _, trial in baseline_last(matrix(trials=4))) == [1, 1, 3, 3]


@pytest.mark.parametrize("groups", range(1, 12))
@pytest.mark.parametrize("rounds", range(2, 10))
def test_every_group_gets_the_same_slots_over_the_rounds(groups, rounds):
    """A linear drift over the session adds the same to every group: the slots of each group summed
    over the rounds are equal, or within one of each other for an even number of groups in an odd
    number of rounds (the slots of two groups then sum to an odd number: no order splits it). The
    old order (forward and backward alternating) spreads three groups over three rounds by 2 slots."""
    orders = round_orders(groups, rounds)
    assert len(orders) == rounds and all(sorted(order) == list(range(groups)) for order in orders)
    sums = [sum(order.index(g) for order in orders) for g in range(groups)]
    assert max(sums) - min(sums) == (1 if groups % 2 == 0 and rounds % 2 else 0)


def test_world_sizes_are_not_reversed_where_the_round_has_no_baseline():
    """--world-size=2 alone: nothing of the round can pair later, so each trial runs its baseline
    first (the fixture) and no round is reversed; one trial: never reversed."""
    assert baseline_last(matrix(trials=2, world_size=[2])) == set()
    assert baseline_last(matrix(trials=1)) == set()
    assert len(baseline_last(matrix(trials=2))) == 2


def test_interleave_leaves_other_items_where_they_were():
    cases = matrix(trials=2, world_size=[2])
    items = ["first", *cases, "last"]
    out = interleave(items)
    assert out[0] == "first" and out[-1] == "last"
    assert [c.trial for c in out[1:-1]] == [1, 1, 2, 2]


def test_the_profile_sets_trials_and_the_flag_overrides_it(tmp_path):
    path = tmp_path / "three.toml"
    path.write_text("trials = 3\n" + (DATA / "tinycpu.toml").read_text())
    profiles = {"three": load_profile(path)}
    assert {c.trials for c in build_cases(profiles, settings())} == {3}
    assert {c.trials for c in build_cases(profiles, settings(trials=2))} == {2}
    path.write_text("trials = 0\n" + (DATA / "tinycpu.toml").read_text())
    with pytest.raises(ProfileError, match=r"three.toml: key 'trials': 0 must be from 1 to 100"):
        load_profile(path)
    path.write_text("trials = 100000\n" + (DATA / "tinycpu.toml").read_text())  # bounded, as the flag
    with pytest.raises(ProfileError, match=r"three.toml: key 'trials': 100000 must be from 1 to 100"):
        load_profile(path)


def stored(name) -> tuple[str, BenchResult]:
    return read_file(next((DATA / "store" / "results").glob(f"*/{name}.json")))


def trial(result: BenchResult, k: int, tokens_per_s: float, created: str = "") -> BenchResult:
    return result.replace(trial=k, run_id=f"{result.case_id}-t{k}", created_utc=created or f"2026-01-0{k}",
                          metrics={**result.metrics, "tokens_per_s": tokens_per_s})


def test_a_baseline_of_the_same_trial_is_found_and_no_other_when_trials_are_several(tmp_path):
    shutil.copytree(DATA / "store" / "results", tmp_path / "results")
    session = BenchSession(settings=Settings(), profiles={}, store=ResultStore(tmp_path))
    profile, ws1 = stored("tinycpu-ddp-ws1-seq64")
    spec2 = stored("tinycpu-ddp-ws2-seq64")[1].spec
    session.records += [(profile, trial(ws1, 1, 100.0)), (profile, trial(ws1, 2, 110.0))]
    assert session.find_baseline(profile, spec2, 1, trial=2, any_trial=False).trial == 2
    assert session.find_baseline(profile, spec2, 1, trial=3, any_trial=False) is None
    assert session.find_baseline(profile, spec2, 1, trial=3).trial == 2  # single-trial rule: any


def test_the_latest_launch_of_each_trial_counts():
    _, ws1 = stored("tinycpu-ddp-ws1-seq64")
    runs = [trial(ws1, 2, 1.0, "2026-01-05"), trial(ws1, 1, 2.0), trial(ws1, 2, 3.0, "2026-01-09")]
    assert [(r.trial, r.metrics["tokens_per_s"]) for r in latest_per_trial(runs)] == [(1, 2.0), (2, 3.0)]


def test_efficiency_over_trials_pairs_each_trial_with_its_rounds_baseline():
    _, ws1 = stored("tinycpu-ddp-ws1-seq64")
    _, ws2 = stored("tinycpu-ddp-ws2-seq64")
    at_1 = [trial(ws1, k, v) for k, v in enumerate([1000.0, 1100.0, 900.0], 1)]
    at_2 = [trial(ws2, k, v) for k, v in enumerate([1700.0, 1500.0, 1600.0], 1)]
    e = trials.efficiency(at_2, at_1)
    assert e.value == pytest.approx(1600 / (2 * 1000))  # mean 1600 at ws2, mean 1000 at ws1
    # by hand: var(a) = var(b) = 10,000, cov = -5,000 over the rounds; se^2 = (10000 / 1600^2 +
    # 10000 / 1000^2 + 2 x 5000 / (1600 x 1000)) / 3 = 0.0067188; t(0.975, 2) = 4.3027
    half = 4.302653 * math.sqrt(0.02015625 / 3)
    assert (e.low, e.high) == pytest.approx((0.8 * math.exp(-half), 0.8 * math.exp(half)), rel=1e-5)
    assert e.method == stats.PAIRED_METHOD
    assert trials.describe(e, "3 rounds").startswith("0.800 (95% interval 0.562-1.138")


def test_a_drift_that_moves_both_runs_of_a_round_cancels_in_the_paired_interval():
    """The machine slows from round to round by 20%; the case scales exactly 0.8 in every round.
    Paired, the efficiency is 0.8 with no width; unpaired, the drift made it look uncertain."""
    _, ws1 = stored("tinycpu-ddp-ws1-seq64")
    _, ws2 = stored("tinycpu-ddp-ws2-seq64")
    base = [1000.0, 800.0, 640.0]
    at_1 = [trial(ws1, k, v) for k, v in enumerate(base, 1)]
    at_2 = [trial(ws2, k, 1.6 * v) for k, v in enumerate(base, 1)]
    paired = trials.efficiency(at_2, at_1)
    assert paired.low == pytest.approx(0.8) and paired.high == pytest.approx(0.8)
    unpaired = trials.efficiency(at_2, at_1[:2])  # a baseline trial missing: no pairing
    assert unpaired.method == stats.RATIO_METHOD and unpaired.high - unpaired.low > 0.3


def test_the_gate_says_single_runs_and_intervals_apart():
    single = gate_rules.gate([90.0], [100.0], 0.05, noise_cv=0.15)
    text = trials.gate_text("tokens_per_s", 5, [90.0], [100.0], single)
    assert text.startswith("tokens_per_s inconclusive: mean 90 over 1 trial(s) vs 100 over 1 in the compared "
                           "run, allowed drop 5%")
    assert "one trial a side: the declared launch noise is the spread" in text
    many = gate_rules.gate([80.0, 81.0, 79.0], [100.0, 101.0, 99.0], 0.05)
    text = trials.gate_text("tokens_per_s", 5, [80.0, 81.0, 79.0], [100.0, 101.0, 99.0], many)
    assert many.outcome == "fail" and text.startswith("tokens_per_s dropped: mean 80 over 3 trial(s) vs 100")
    assert "false-alarm budget 2% at this look" in text and "drop 80% of the time" in text


def test_summary_row_of_trials_is_stats_summary_of_the_ok_ones():
    _, ws1 = stored("tinycpu-ddp-ws1-seq64")
    failed = BenchResult.failure(ws1.spec, status="timeout", error="hung", trial=3)
    row = trials.summary_row([trial(ws1, 1, 10.0), trial(ws1, 2, 14.0), failed])
    s = stats.summary([10.0, 14.0])
    assert row == {"n": 2, "mean": 12.0, "median": 12.0, "low": s.low, "high": s.high, "cv": s.cv}


def test_an_ab_round_with_a_scaling_floor_runs_its_baseline_beside_it(monkeypatch):
    """Issue 66: in an A/B session the ws1 test runs all its rounds before the ws2 test; paired with
    those, a drift between the two tests reads as efficiency. Each candidate round of a case with a
    floor runs ws1 in the same round, before it in odd rounds and after it in even ones, and pairs
    with it; a case with no floor runs alone."""
    import dataclasses

    from pytest_llmbench import runner as runner_mod

    cases = {c.trial: c for c in matrix(strategy=["ddp"], world_size=[2], trials=2)}
    floor = {2: 0.7}
    floored = {k: dataclasses.replace(c, profile=dataclasses.replace(c.profile, min_scaling_efficiency=floor))
               for k, c in cases.items()}
    launched: list[tuple[int, int, str | None]] = []
    replaced: list[BenchResult] = []

    def launch(self, c, *, baseline, reason=None, side=None):
        launched.append((c.spec.world_size, c.trial, baseline and baseline.run_id))
        measured = stored(f"tinycpu-ddp-ws{c.spec.world_size}-seq64")[1]
        return runner_mod.with_scaling(measured.replace(trial=c.trial, run_id=f"r{len(launched)}"), baseline,
                                       reason or "")

    monkeypatch.setattr(runner_mod.Runner, "_launch", launch)
    run = object.__new__(runner_mod.Runner)
    run.say = lambda text: None
    run.session = type("S", (), {"find_baseline": lambda *a, **k: None,
                                 "replace": lambda self, profile, r: replaced.append(r)})()
    candidate = ab_side("candidate")
    odd = run.launch_side(floored[1], candidate, first=True)
    assert launched == [(1, 1, None), (2, 1, "r1")] and odd.metrics["scaling_efficiency"] is not None
    launched.clear()
    even = run.launch_side(floored[2], candidate, first=False)
    assert launched == [(2, 2, None), (1, 2, None)]  # ws2 first, then its round's ws1
    assert replaced == [even] and even.run_id == "r1" and even.metrics["scaling_efficiency"] == pytest.approx(
        even.metrics["tokens_per_s"] / (2 * stored("tinycpu-ddp-ws1-seq64")[1].metrics["tokens_per_s"]))
    launched.clear()
    run.launch_side(cases[2], candidate, first=False)  # no floor at ws2: no extra launch
    assert [(w, t) for w, t, _ in launched] == [(2, 2)]


def ab_side(name: str):
    from pytest_llmbench.ab import Side

    return Side(name=name, spelled="")
