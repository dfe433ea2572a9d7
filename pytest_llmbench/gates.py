"""The regression gates (--llmbench-fail-below METRIC:PCT), out of the Runner that launches cases.

Two ways to gate a change, every gate in the session's one error budget (pytest_llmbench/budget.py):

- **A/B in one session** (``--llmbench-ab SIDE``, pytest_llmbench/ab.py), the way to gate a change:
  each case runs in rounds on both sides, A then B, then B then A (ABBA...), on the same machine.
  Round r gives one paired log ratio log(candidate_r / baseline_r); a drift of the machine between
  rounds moves both and cancels. The verdict is ``gate_rules.paired_gate`` on those ratios: the spread
  is the rounds' own, measured (the profile's ``launch_noise_cv`` only plans the round count before
  any round has run). Looks at ``--llmbench-trials`` rounds (default budget.AB_FIRST), doubling, up
  to ``--llmbench-trials-max`` (default budget.AB_CAP), the gate's share spent over them
  (``budget.spend``). Each verdict states the drop it catches with 80% power at the measured spread.
  At session end the suite test pools every case's first look (``suite_failures``).
- **Against a stored session** (``--llmbench-compare SESSION``): pytest_llmbench/compare_gate.py.

A metric where lower is better (step time, peak memory) is gated as its inverse: ``METRIC:PCT``
is always "at most PCT worse" (``worse_allowed``).
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from harness.result import BenchResult
from pytest_llmbench import budget, gate_rules, power, stats
from pytest_llmbench.budget import confirmed, goodness, higher, worse_allowed
from pytest_llmbench.cases import Case


class Runner(Protocol):
    """What the gates need of the case runner (pytest_llmbench/runner.py's Runner): the session and
    its settings, a progress line, and launches. Declared here, so that the gates do not import the
    runner that calls them."""

    session: Any
    settings: Any

    def say(self, text: str) -> None: ...
    def launch_side(self, case: Case, side: Any, *, first: bool) -> BenchResult: ...
    def launch_with_baseline(self, case: Case) -> BenchResult: ...
    def last_trial(self, case: Case) -> int: ...

# ---- A/B in one session -----------------------------------------------------------------------

def ab_first_look(settings) -> int:
    """Rounds at the A/B gate's first look: --llmbench-trials, else AB_FIRST (two at least: a spread)."""
    return max(settings.trials or budget.AB_FIRST, 2)


def ab_rounds(runner: Runner, case: Case) -> BenchResult:
    """Run the case's rounds on both sides until every gate decides (or the cap); the candidate's
    last result. The verdicts go to the session (``ab_verdicts``), checked by ``ab_failures``, and the
    first look's ratios to the suite test (``suite_failures``)."""
    session, settings = runner.session, runner.settings
    first = ab_first_look(settings)
    # with no gate: the first look's rounds, for the report's paired ratios
    cap = max(settings.trials_max or budget.AB_CAP, first) if settings.fail_below else first
    alpha = session.budget.gate_alpha()
    runner.say(f"{case.name}: A/B against {session.sides['baseline'].spelled}; "
               + power.rounds_plan(case, settings.fail_below or [], gate_rules.looks(first, cap), alpha))
    last: list[BenchResult] = []

    def one_round(r: int) -> tuple[dict, dict] | None:
        order = ("candidate", "baseline") if r % 2 else ("baseline", "candidate")  # ABBA...
        ran = {side: runner.launch_side(case.at_trial(r), session.sides[side], first=r == 1)
               for side in order}
        last[:] = [ran["candidate"]]
        failed = [side for side in order if not ran[side].ok]
        if failed:
            session.ab_notes.setdefault(case.name, []).append(
                f"{failed[0]} side failed in round {r}: {ran[failed[0]].status}: {ran[failed[0]].error}")
            return None
        return ran["candidate"].metrics, ran["baseline"].metrics

    def said(r: int, verdicts: dict[str, gate_rules.GateVerdict]) -> None:
        runner.say(f"{case.name}: round {r}: " + "; ".join(
            f"{m} {v.outcome} (new/old {v.ratio.value:.3f})" for m, v in verdicts.items()))

    def calibrated(lines: list[str]) -> None:
        for line in lines:
            runner.say(f"{case.name}: {line}")
            session.notes.append(f"{case.name}: {line}")

    ran = sequential(one_round, settings.fail_below or [], first=first, cap=cap, alpha=alpha, progress=said,
                     calibrate=calibrated)
    session.ab_verdicts[case.name] = (ran.rounds, ran.verdicts)
    if ran.rounds >= first:
        session.ab_first[case.name] = {m: r[:first] for m, r in ran.log_ratios.items()}
    return last[0]


@dataclass
class Sequence:
    """What ``sequential`` ran: rounds, the verdicts at its last look and each metric's log ratios
    (higher-is-better: ``goodness``)."""

    rounds: int
    verdicts: dict[str, gate_rules.GateVerdict]
    log_ratios: dict[str, list[float]]


def sequential(one_round, gated: list[tuple[str, float]], *, first: int, cap: int, alpha: float,
               progress=lambda r, verdicts: None, confirm: int | None = None,
               calibrate=None) -> Sequence:
    """The A/B gate's loop: ``one_round(r)`` gives round r's (candidate metrics, baseline metrics), or
    None when a side failed (the loop ends); at each planned look (``gate_rules.looks(first, cap)``) every
    gate of ``gated`` [(metric, allowed %)] is judged on the rounds so far (``gate_rules.paired_gate`` at
    the look's share of ``alpha``, ``budget.spend``); it stops once all decide. A failure stands only
    once a confirming block of ``confirm`` more rounds (default: ``first``) shows it again
    (``budget.confirmed``). At the first look ``calibrate`` gets each gate's ``calibration``: the noise
    measured and what it can resolve. The Runner launches the rounds; tests/unit/test_gates.py draws them."""
    confirm = first if confirm is None else confirm
    points = gate_rules.looks(first, cap)
    shares, beta = budget.spend(alpha, points), budget.misses(points)
    ratios: dict[str, list[float]] = {metric: [] for metric, _ in gated}
    verdicts: dict[str, gate_rules.GateVerdict] = {}
    rounds = 0
    for r in range(1, cap + 1):
        pair = one_round(r)
        if pair is None:
            break
        rounds = r
        _add_round(ratios, pair)
        if calibrate is not None and r == points[0] and gated and r >= 2:
            calibrate([power.calibration(metric, ratios[metric], worse_allowed(metric, pct), points, alpha)
                       for metric, pct in gated])
        if r in points and gated:
            k = points.index(r)
            verdicts = {metric: gate_rules.paired_gate(ratios[metric], worse_allowed(metric, pct),
                                                       alpha=shares[k], beta=beta[k], last_look=r >= cap,
                                                       cap=cap, alpha_last=shares[-1])
                        for metric, pct in gated}
            if all(v.outcome != "inconclusive" for v in verdicts.values()):
                break
            progress(r, verdicts)
    if confirm and any(v.outcome == "fail" for v in verdicts.values()):
        rounds, verdicts = _confirm(one_round, gated, rounds, confirm, verdicts)
    if calibrate is not None and confirm:  # a session's verdicts state power with the block counted
        verdicts = {m: power.with_block(v, ratios[m], worse_allowed(m, pct), points, alpha, confirm)
                    for (m, pct) in gated if (v := verdicts.get(m)) is not None}
    return Sequence(rounds, verdicts, ratios)


def _confirm(one_round, gated: list[tuple[str, float]], rounds: int, block: int,
             verdicts: dict[str, gate_rules.GateVerdict]) -> tuple[int, dict[str, gate_rules.GateVerdict]]:
    """``block`` more rounds before a failure stands (budget.confirmed): (rounds run, verdicts)."""
    logs: dict[str, list[float]] = {metric: [] for metric, _ in gated}
    for r in range(rounds + 1, rounds + block + 1):
        pair = one_round(r)
        if pair is None:
            break
        rounds = r
        _add_round(logs, pair)
    return rounds, {m: confirmed(v, logs[m]) if v.outcome == "fail" else v for m, v in verdicts.items()}


def _add_round(ratios: dict[str, list[float]], pair: tuple[dict, dict]) -> None:
    """Each metric's paired log ratio of one round (as goodness), added to its list."""
    for metric in ratios:
        candidate, baseline = pair[0].get(metric), pair[1].get(metric)
        ratios[metric] += stats.paired_log_ratios([goodness(metric, candidate, baseline)])


def verdicts_json(session, suite: list[str]) -> str:
    """Every A/B verdict of the session as data (``store.GATES``, read by ``--llmbench-bisect``): per
    case and metric the outcome, new/old (as goodness), its one-sided bounds and the rounds; the
    suite tests that failed."""
    def number(x):  # JSON has no NaN or infinity (the store reads strict JSON)
        return x if isinstance(x, (int, float)) and math.isfinite(x) else None

    cases = {}
    for name, (rounds, verdicts) in session.ab_verdicts.items():
        cases[name] = {metric: {"outcome": v.outcome, "ratio": number(v.ratio.value), "rounds": rounds,
                                "low": number(v.ratio.low), "high": number(v.ratio.high)}
                       for metric, v in verdicts.items()}
    notes = {name: list(lines) for name, lines in session.ab_notes.items()}
    return json.dumps({"cases": cases, "side_failures": notes, "suite_failures": suite}, indent=1,
                      sort_keys=True)


def ab_failures(runner: Runner, case: Case) -> list[str]:
    """The A/B gates' failures for the case; an undecided gate is a warning saying what it needed."""
    session = runner.session
    out = list(session.ab_notes.get(case.name, []))
    rounds, verdicts = session.ab_verdicts.get(case.name, (0, {}))
    for metric, pct in runner.settings.fail_below or []:
        verdict = verdicts.get(metric)
        if verdict is None:
            continue
        text = (f"{metric} A/B over {rounds} round(s) against {session.sides['baseline'].spelled}, "
                f"allowed {'drop' if higher(metric) else 'rise'} {pct:g}%: {verdict.text}")
        session.notes.append(f"{case.name}: {metric}: A/B {verdict.outcome} (new/old "
                             f"{verdict.ratio.value:.3f}, {rounds} rounds)")
        if verdict.outcome == "fail":
            out.append(text)
        elif verdict.outcome == "inconclusive":
            ratios = log_ratios_of(session, case, metric)
            sd = statistics.stdev(ratios) if len(ratios) > 1 else None
            need = budget.rounds_needed(sd, worse_allowed(metric, pct), alpha=session.budget.gate_alpha()
                                        ) if sd else None
            text += f"; at the measured spread it would need {need or 'more than 10,000'} rounds"
            warnings.warn(pytest.PytestWarning(f"llmbench {case.name}: {text}"), stacklevel=1)
    return out


def log_ratios_of(session, case: Case, metric: str) -> list[float]:
    """The case's rounds' log ratios of ``metric`` as goodness (``goodness``), from the session's records."""
    bases = {r.trial: r for r in session.side_trials(case.profile.name, case.spec.case_id) if r.ok}
    cands = [c for c in session.trials_of(case.profile.name, case.spec.case_id) if c.ok and c.trial in bases]
    return stats.paired_log_ratios([goodness(metric, c.metrics.get(metric),
                                             bases[c.trial].metrics.get(metric)) for c in cands])
