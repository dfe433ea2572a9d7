"""The session's one error budget at suite scale, simulated with the gates' own code (seeded).

A CI session of 51 cases, each with two gated metrics (tokens/s and the median step time, lower is
better), a memory budget and a scaling floor: 204 case gates and two suite tests
(``budget.Budget``). Each case runs ``gates.sequential`` (the A/B loop the Runner runs, launches
replaced by draws) on the drifting machine of tests/unit/test_gates.py: a session effect (the
machine's level when the session starts), a random walk between rounds, drift within a round, a
burner starting partway in half the sessions, and trial noise whose paired spread is 0.05 a round
while the profile declares half of it. The memory budget and the floor are judged by the function
their verdicts call (``gate_rules.floor_check``) on the candidate's rounds, each case truly at its budget
and at its floor (the worst case for false alarms), memory noise twice the declared
``memory_noise_cv``. The suite test is ``budget.suite_failures``'s (``budget.suite_test``).

Each test prints the rates it measured; the issue's bounds are asserted.
"""

from __future__ import annotations

import functools
import math
import random
import statistics

from pytest_llmbench import budget, gate_rules, gates
from tests.unit.test_gates import Machine

CASES, ALLOWED = 51, 5.0
METRICS = (("tokens_per_s", ALLOWED), ("step_time_median_s", ALLOWED))
NOISE = 0.05 / math.sqrt(2)  # a launch's log sd: with the within-round drift, paired sd about 0.05
DECLARED_MEMORY, TRUE_MEMORY = 0.01, 0.02  # memory_noise_cv declared at half the truth
FLOOR = 0.8
BUDGET = budget.Budget(case_gates=CASES * len(METRICS), memory=CASES, floors=CASES, suites=len(METRICS))


def session(rng: random.Random, trues: list[float], *, stop_after: int | None = None) -> dict:
    """One A/B session of len(trues) cases on one drifting machine: which gate kinds failed, the
    rounds each case ran and each case's tokens/s verdict. ``stop_after``: end every case after this
    many rounds (its gates judged at the default cap's looks up to there)."""
    machine = Machine(rng, rng.randrange(20 * CASES) if rng.random() < 0.5 else None, NOISE)
    machine.level = rng.gauss(0, 0.05)  # the session effect
    alpha, failed, rounds, verdicts, first = BUDGET.gate_alpha(), set(), [], [], {}
    for case, true in enumerate(trues):
        def one_round(r: int, true=true):
            return None if stop_after and r > stop_after else machine.round(math.log(true), r)

        ran = gates.sequential(one_round, list(METRICS), first=budget.AB_FIRST, cap=budget.AB_CAP,
                               alpha=alpha)
        rounds.append(ran.rounds)
        verdicts.append(ran.verdicts["tokens_per_s"].outcome)
        first[case] = {m: r[:budget.AB_FIRST] for m, r in ran.log_ratios.items()}
        if any(v.outcome == "fail" for v in ran.verdicts.values()):
            failed.add("case gate")
        # at the budget: log(budget / peak) per round; at the floor: log(efficiency / floor) per round
        memory = [rng.gauss(0, TRUE_MEMORY) for _ in range(ran.rounds)]
        memory_check = gate_rules.floor_check(memory, 1.0, noise_cv=DECLARED_MEMORY, launches=1, alpha=alpha)
        if memory_check.outcome == "fail":
            failed.add("memory budget")
        floor = [math.log(FLOOR) + rng.gauss(0, 0.05) for _ in range(ran.rounds)]
        if gate_rules.floor_check(floor, FLOOR, alpha=alpha).outcome == "fail":
            failed.add("scaling floor")
    suite = budget.suite_failures(_Session(first))
    if suite:
        failed.add("suite")
    return {"failed": failed, "rounds": rounds, "verdicts": verdicts}


class _Session:
    """What ``budget.suite_failures`` reads of a BenchSession."""

    def __init__(self, first: dict) -> None:
        self.ab_first, self.budget, self.notes = first, BUDGET, []
        self.settings = type("S", (), {"fail_below": list(METRICS)})()


def test_clean_sessions_of_51_cases_fail_at_most_two_percent_counting_every_gate_kind():
    rng = random.Random(20261127)
    runs = [session(rng, [1.0] * CASES) for _ in range(500)]
    rate = statistics.fmean(bool(s["failed"]) for s in runs)
    kinds = {k: sum(k in s["failed"] for s in runs) for k in ("case gate", "memory budget", "scaling floor",
                                                                 "suite")}
    mean_rounds = statistics.fmean(r for s in runs for r in s["rounds"])
    print(f"clean 51-case sessions: {rate:.2%} of {len(runs)} failed ({kinds}); "
          f"{mean_rounds:.1f} rounds a case on average")
    assert rate <= budget.SESSION_ALPHA, rate
    assert mean_rounds <= 2 * 8  # a clean case passes by its second look almost always


def test_one_case_ten_percent_slower_is_caught_at_least_60_percent_of_the_time_within_the_cap():
    """Step time 10% longer (tokens/s x 1/1.1), 5% allowed, at a gate's share of a 51-case session."""
    rng = random.Random(7)
    caught, rounds = [], []
    for _ in range(300):
        machine = Machine(rng, None, NOISE)
        ran = gates.sequential(functools.partial(machine.round, math.log(1 / 1.1)), list(METRICS),
                               first=budget.AB_FIRST, cap=budget.AB_CAP, alpha=BUDGET.gate_alpha())
        caught.append(any(v.outcome == "fail" for v in ran.verdicts.values()))
        rounds.append(ran.rounds)
    rate = statistics.fmean(caught)
    print(f"one case 10% slower in a 51-case session: caught {rate:.0%} of 300 within {budget.AB_CAP} "
          f"rounds (gate share {BUDGET.gate_alpha():.3g}); {statistics.fmean(rounds):.1f} rounds on average")
    assert rate >= 0.60, rate


def test_a_case_at_the_allowed_drop_fails_within_its_share():
    """At exactly 5% slower the gate's rate is its share (7.4e-5 here, out of a simulation's reach but
    counted), and at the whole 2% alone it is measured in tests/unit/test_gates.py."""
    rng = random.Random(13)
    fails = 0
    for _ in range(400):
        machine = Machine(rng, None, NOISE)
        at_allowed = functools.partial(machine.round, math.log(1 - ALLOWED / 100))
        ran = gates.sequential(at_allowed, list(METRICS[:1]), first=budget.AB_FIRST, cap=budget.AB_CAP,
                               alpha=BUDGET.gate_alpha())
        fails += ran.verdicts["tokens_per_s"].outcome == "fail"
    print(f"a case at the allowed drop: {fails} of 400 failed at the share {BUDGET.gate_alpha():.3g}")
    assert fails <= 1


def test_every_case_seven_percent_slower_fails_the_session_within_eight_rounds():
    rng = random.Random(3)
    runs = [session(rng, [0.93] * CASES, stop_after=8) for _ in range(60)]
    rate = statistics.fmean(bool(s["failed"]) for s in runs)
    suite = statistics.fmean("suite" in s["failed"] for s in runs)
    print(f"every case 7% slower: {rate:.0%} of {len(runs)} sessions failed within 8 rounds a case "
          f"(the suite test alone: {suite:.0%})")
    assert rate >= 0.95, rate


def test_without_the_suite_test_or_with_the_old_cap_the_bounds_are_missed():
    """The test has teeth: the per-case gates alone miss a suite-wide 7% drop, and the old cap of 16
    catches the one 10% slower case far less often."""
    rng = random.Random(5)
    alone = [session(rng, [0.93] * CASES, stop_after=8) for _ in range(10)]
    assert statistics.fmean("case gate" in s["failed"] for s in alone) < 0.5
    caught = 0
    for _ in range(150):
        machine = Machine(rng, None, NOISE)
        ran = gates.sequential(functools.partial(machine.round, math.log(1 / 1.1)), list(METRICS),
                               first=budget.AB_FIRST, cap=16, alpha=BUDGET.gate_alpha())
        caught += any(v.outcome == "fail" for v in ran.verdicts.values())
    print(f"with the old cap of 16: caught {caught / 150:.0%} of 150; the per-case gates alone fail "
          f"{statistics.fmean('case gate' in s['failed'] for s in alone):.0%} of 10 sessions 7% slower")
    assert caught / 150 < 0.6
