"""The gates' stated rates under the conditions CI has, simulated with the gates' own code (seeded):
``gates.sequential`` (the A/B loop the Runner runs, launches replaced by draws), ``stats.paired_gate``,
``gates.gate_alpha`` (the session's 2% split over its gates), and ``stats.gate`` for the stored session.

The machine drifts: a random walk between rounds (sd 5% a round), drift within a round (sd 1%
between its two launches), and in half the sessions a CPU burner starting at a random launch that
slows everything after it by 30%. The trial noise is 10%, twice the 5% a profile would declare. The
A/B gate never reads the declared noise (its spread is the rounds' own), so it must hold its stated
rates here: a session of two clean cases fails at most 2% of the time; a 10% slower step (a drop of
about twice the allowed 5%) is caught at least 80% of the time where the cap suffices for the true
spread. The stored-session gate assumes no session effect: under a session effect of 3% and the 2x
misdeclared noise its false alarms exceed its stated 2%, and its message says that it does not hold.
"""

from __future__ import annotations

import functools
import math
import random
import statistics

import pytest

from pytest_llmbench import gates, stats

DRAWS = 1500
ALLOWED = 5.0


class Machine:
    """Launches on a drifting machine: a random walk between rounds (sd 5%) and within them (sd 1% a
    launch), a burner slowing every launch after ``burner_at`` by 30% (None: no burner)."""

    def __init__(self, rng: random.Random, burner_at: int | None, noise: float) -> None:
        self.rng, self.burner_at, self.noise = rng, burner_at, noise
        self.level, self.launches = 0.0, 0

    def launch(self, offset: float) -> float:
        self.launches += 1
        self.level += self.rng.gauss(0, 0.01)
        burn = math.log(0.7) if self.burner_at is not None and self.launches > self.burner_at else 0.0
        return math.exp(self.level + burn + offset + self.rng.gauss(0, self.noise))

    def round(self, log_true: float, r: int) -> tuple[dict, dict]:
        """Round r: the candidate first in odd rounds, second in even ones (ABBA)."""
        self.level += self.rng.gauss(0, 0.05)
        if r % 2:
            a = self.launch(log_true)
            b = self.launch(0.0)
        else:
            b = self.launch(0.0)
            a = self.launch(log_true)
        return {"tokens_per_s": a}, {"tokens_per_s": b}


def ab_session(rng: random.Random, true_ratios: list[float], noise: float, burner: float = 0.5,
               ) -> tuple[list[str], list[int]]:
    """One A/B session of ``len(true_ratios)`` gated cases on a drifting machine (a burner in a
    ``burner`` share of them): each case's outcome and rounds."""
    alpha = gates.gate_alpha(len(true_ratios))
    outcomes, rounds_run = [], []
    for true in true_ratios:
        machine = Machine(rng, rng.randrange(2 * gates.AB_CAP) if rng.random() < burner else None, noise)
        rounds, verdicts = gates.sequential(functools.partial(machine.round, math.log(true)),
                                            [("tokens_per_s", ALLOWED)], first=gates.AB_FIRST,
                                            cap=gates.AB_CAP, alpha=alpha)
        outcomes.append(verdicts["tokens_per_s"].outcome)
        rounds_run.append(rounds)
    return outcomes, rounds_run


def test_clean_ab_sessions_fail_at_most_the_stated_two_percent_on_a_drifting_machine():
    rng = random.Random(42)
    failed = sum("fail" in ab_session(rng, [1.0, 1.0], noise=0.10)[0] for _ in range(DRAWS))
    rate = failed / DRAWS
    # 2% stated for the session; 3 binomial sd of Monte Carlo error above it
    assert rate <= gates.SESSION_ALPHA + 3 * math.sqrt(0.02 * 0.98 / DRAWS), rate


def test_a_ten_percent_slower_step_is_caught_where_the_cap_suffices_for_the_true_spread():
    """On the drifting machine without a burner (a burner that starts between a round's two launches
    makes that round an outlier: the measured spread grows and the gate waits, see below)."""
    rng = random.Random(7)
    # the spread a round's pair has here: two launches' noise and the within-round drift
    noise = 0.03
    paired_sd = math.sqrt(2 * noise**2 + 0.01**2)
    looks = stats.looks(gates.AB_FIRST, gates.AB_CAP)
    needed = stats.rounds_for_paired_gate(paired_sd, ALLOWED / 100, looks_at=looks, alpha=gates.gate_alpha(2))
    assert needed is not None and needed <= gates.AB_CAP  # the cap suffices: the stated power applies
    outcomes = [ab_session(rng, [1 / 1.1, 1 / 1.1], noise=noise, burner=0.0) for _ in range(DRAWS // 3)]
    caught = statistics.fmean(o == "fail" for session, _ in outcomes for o in session)
    assert caught >= stats.POWER, caught
    assert statistics.fmean(r for _, rounds in outcomes for r in rounds) <= gates.AB_CAP


def test_a_burner_or_noise_beyond_the_cap_leaves_the_gate_undecided_never_failed():
    """A 10% slower step with a burner in every session, or at 10% trial noise: the spread the rounds
    measure is too wide for the cap, and the gate ends inconclusive (a warning) more often than it
    passes a slower candidate; rounds_needed says how many rounds that spread would take."""
    rng = random.Random(3)
    burnt = [o for _ in range(300) for o in ab_session(rng, [1 / 1.1], noise=0.03, burner=1.0)[0]]
    assert burnt.count("pass") <= 0.2 * len(burnt)  # a slower candidate is rarely passed
    noisy = [o for _ in range(300) for o in ab_session(rng, [1.0], noise=0.10)[0]]
    assert noisy.count("inconclusive") > 0 and noisy.count("fail") <= 0.03 * len(noisy)
    assert stats.rounds_needed(math.sqrt(2) * 0.10, ALLOWED / 100) > gates.AB_CAP


def test_the_stored_session_gate_exceeds_its_rate_under_a_session_effect_and_says_so():
    rng = random.Random(11)
    declared, true_noise, session_sd, trials = 0.05, 0.10, 0.03, 1  # a profile's default: one trial
    failed, means = 0, []
    for _ in range(DRAWS):
        old_effect, new_effect = rng.gauss(0, session_sd), rng.gauss(0, session_sd)
        old = [math.exp(old_effect + rng.gauss(0, true_noise)) for _ in range(trials)]
        new = [math.exp(new_effect + rng.gauss(0, true_noise)) for _ in range(trials)]
        means.append(statistics.fmean(math.log(v) for v in old))
        verdict = stats.gate(new, old, ALLOWED / 100, noise_cv=declared, alpha=gates.gate_alpha(1))
        failed += verdict.outcome == "fail"
    assert failed / DRAWS > gates.SESSION_ALPHA  # the stated 2% does not hold under a session effect
    text = gates.session_effect_text(means[:20], ALLOWED / 100)  # the store's 20 earlier sessions
    assert "does not hold" in text and "--llmbench-ab" in text
    quiet = gates.session_effect_text([rng.gauss(0, 0.005) for _ in range(20)], ALLOWED / 100)
    assert "within half the allowed drop" in quiet
    assert "fewer than two earlier sessions" in gates.session_effect_text([0.1], ALLOWED / 100)


@pytest.mark.parametrize("gates_in_session", [1, 2, 8])
def test_each_gate_spends_the_sessions_two_percent_split_evenly(gates_in_session):
    assert gates.gate_alpha(gates_in_session) * gates_in_session == pytest.approx(gates.SESSION_ALPHA)
    share = f"each gate at {gates.SESSION_ALPHA / gates_in_session:.2%}"
    assert share in gates.error_rate_line(gates_in_session)


def test_a_floor_far_below_one_is_judged_not_a_math_error():
    """The scaling floor's unpaired check is ``stats.gate`` with an allowed drop of 1 - floor: a cpu
    floor of 0.4 is 60%, whose double leaves nothing (log of a negative: 'math domain error', which
    an A/B session hit once its ws2 case ran more rounds than its ws1 baseline)."""
    assert stats.gate([1.0, 0.9, 1.1], [5.0, 5.2, 4.9], 0.6).outcome == "fail"  # 0.2 of the baseline
    assert stats.gate([1.0, 0.95, 1.05], [1.1, 1.0, 1.05], 0.6).outcome == "pass"


def test_the_report_and_the_gate_read_one_paired_estimate_through_the_store(tmp_path):
    """An A/B session stored through the store (ResultStore.save_side): the report's A/B row is the
    gate's own estimate, exp(mean of the rounds' log ratios) with its t-interval, labelled so, and the
    store alone knows where the baseline side and the facts live."""
    import json
    import math
    from pathlib import Path
    from types import SimpleNamespace

    from harness.result import BenchResult
    from pytest_llmbench import stats
    from pytest_llmbench.report.sections import ab as ab_section
    from pytest_llmbench.store import ResultStore

    data = json.loads(next((Path(__file__).parents[1] / "data" / "store" / "results").glob(
        "*/tinycpu-ddp-ws1-seq64.json")).read_text())
    data.pop("profile")
    store = ResultStore(tmp_path, "20261127T000000Z-ab01")
    pairs = [(1000.0, 1100.0), (1020.0, 1090.0), (990.0, 1120.0), (1010.0, 1080.0)]
    for trial, (a, b) in enumerate(pairs, 1):
        one = BenchResult.from_dict({**data, "trial": trial})
        store.save(one.replace(metrics={**one.metrics, "tokens_per_s": a}), profile="tinycpu")
        store.save_side(one.replace(metrics={**one.metrics, "tokens_per_s": b}), profile="tinycpu",
                        facts_json=json.dumps({"baseline": {"side": "env=x.env"}}))
    facts, side = store.ab_session(store.session_id)
    assert facts == {"baseline": {"side": "env=x.env"}} and len(side) == 4
    assert store.ab_session("20261127T000000Z-none") is None
    view = SimpleNamespace(output=tmp_path, loaded=SimpleNamespace(sessions=[store.session_id]))
    got = ab_section.ab_rows(view)
    (row,) = got["ab_rows"]
    logs = [math.log(a / b) for a, b in pairs]
    expected = stats.mean_log_ratio_interval(logs)
    assert stats.paired_log_ratios(pairs) == logs and got["paired_method"] == stats.PAIRED_ROUNDS_METHOD
    assert row["ratio"] == f"{expected.value:.3f} ({expected.low:.3f} to {expected.high:.3f})"
    assert row["rounds"] == 4 and expected.value == pytest.approx(math.exp(sum(logs) / 4))
    verdict = stats.paired_gate(logs, 0.05)
    assert verdict.ratio.value == pytest.approx(expected.value)  # the gate judged the same estimate
