"""The regression gate against a stored session (``--llmbench-compare SESSION``): the case's trials now
against its trials then, ``gate_rules.gate``, its bounds widened by the session effect the store's earlier
sessions of the case show (``budget.session_effect``), or saying that none could be estimated; an
undecided gate runs more trials up to --llmbench-trials-max. ``history`` gives the memory budget and
the scaling floor the same store's noise. The A/B gate is pytest_llmbench/gates.py.
"""

from __future__ import annotations

import math
import warnings

import pytest

from harness.result import BenchResult
from pytest_llmbench import budget, gate_rules, trials
from pytest_llmbench.budget import higher, worse_allowed
from pytest_llmbench.cases import Case
from pytest_llmbench.gates import Runner
from pytest_llmbench.machine import machine


def stored(runner: Runner, case: Case, ok: list[BenchResult]) -> list[str]:
    """--llmbench-fail-below against the compared run's trials of the case (gate_rules.gate), its bounds
    widened by the session effect the store shows (``session_effect``); an inconclusive gate runs
    more trials up to --llmbench-trials-max, then says so."""
    session, settings = runner.session, runner.settings
    if not settings.fail_below or not ok or not settings.compare:
        return []
    name = case.profile.name
    compared = [r for r in session.compared(name, case.spec.case_id) if r.ok]
    before = [r for r in compared if r.spec.identity() == case.spec.identity()]
    if not before:
        return _nothing_to_compare(session, case, compared)
    now, then = machine(ok[-1].env), machine(before[-1].env)
    if now != then:  # a gate that cannot compare does not pass
        return [f"the compared run {session.store.resolve_session(settings.compare)} measured this case on "
                f"{then!r}, this session on {now!r}: another machine's numbers are no "
                f"baseline, so the gate cannot compare and the case fails (compare with a session of this "
                f"machine, or name the runner with --llmbench-runner where it is the same kind)"]
    out = []
    for metric, pct in settings.fail_below:
        new, old = _goodness_values(ok, metric), _goodness_values(before, metric)
        if not new or not old:
            session.notes.append(f"{case.name}: {metric} empty; gate skipped")
            continue
        verdict, new, effect = _stored_gate(runner, case, ok, old, metric, pct, out)
        text = trials.gate_text(metric, pct, new, old, verdict) + "; " + effect.text
        if verdict.outcome == "fail":
            out.append(text)
        elif verdict.outcome == "inconclusive":
            session.notes.append(f"{case.name}: {text}")
            warnings.warn(pytest.PytestWarning(f"llmbench {case.name}: {text}"), stacklevel=1)
    return out


def _stored_gate(runner: Runner, case: Case, ok: list[BenchResult], old: list[float], metric: str,
                 pct: float, out: list[str]
                 ) -> tuple[gate_rules.GateVerdict, list[float], budget.SessionEffect]:
    """One metric's stored-session gate, running more trials while undecided (a failed one's words
    go to ``out``): its last verdict, the trial values it judged and the session effect it allowed."""
    effect = session_effect(runner, case, metric, machine(ok[-1].env))
    new = _goodness_values(ok, metric)
    cap = max(runner.settings.trials_max or 0, len(new))
    points = gate_rules.looks(len(new), cap)  # decide at these trial counts (gate_rules.looks)
    shares, beta = budget.spend(runner.session.budget.gate_alpha(), points), budget.misses(points)
    noise = math.expm1(effect.within_sd) if effect.within_sd else case.profile.launch_noise_cv

    def judge(new: list[float]) -> gate_rules.GateVerdict:
        k = points.index(len(new)) if len(new) in points else len(points) - 1
        history = (effect.total_var, effect.total_df) if effect.total_var is not None else None
        return gate_rules.gate(new, old, worse_allowed(metric, pct), noise_cv=noise, alpha=shares[k],
                               beta=beta[k], last_look=len(new) >= cap, session_var=effect.variance,
                               history=history)

    verdict = judge(new)
    while verdict.outcome == "inconclusive" and (last := runner.last_trial(case)) < cap:
        extra = case.at_trial(last + 1)
        runner.say(f"{case.name}: {metric} gate undecided ({verdict.text}); running trial "
                   f"{extra.trial} of at most {cap}")
        # its scaling baseline from its own round (run first if that round has none), so
        # its efficiency pairs like every other trial's (trials.efficiency)
        more = runner.launch_with_baseline(extra)
        if not more.ok:
            out.append(more.describe_failure())
            break
        ok.append(more)
        new = _goodness_values(ok, metric)
        if len(new) in points:
            verdict = judge(new)
    return verdict, new, effect


def _goodness_values(results: list[BenchResult], metric: str) -> list[float]:
    """The trials' values of ``metric``, inverted where lower is better (``goodness``)."""
    values = trials.values(results, metric)
    return values if higher(metric) else [1 / v for v in values if v > 0]


def _nothing_to_compare(session, case: Case, compared: list[BenchResult]) -> list[str]:
    """The stored-session gate's verdict where the compared run has no result of the same case: a
    warning when it ran another case under this id or never ran it, a failure when it holds files this
    version cannot read (the case may be among them: a gate that cannot compare does not pass)."""
    compared_id = session.store.resolve_session(session.settings.compare)
    unreadable = session.compared_skipped  # read with the compared run, once (session.compared)
    if compared:  # the same id, another case: the profile or a flag changed since
        text = (f"{case.name}: the compared run's case of this id is not the same case "
                f"({', '.join(compared[-1].spec.differences(case.spec))}); no regression gate")
    elif unreadable:
        path, why = unreadable[0]
        return [f"the compared run {compared_id} holds {len(unreadable)} result file(s) this version "
                f"cannot read (first: {path.name}: {why}), and no readable result of this case: the "
                f"gate cannot compare, so the case fails (compare with a session this version reads)"]
    else:
        text = f"{case.name}: not in the compared run {compared_id}; no regression gate for this case"
    session.notes.append(text)
    warnings.warn(pytest.PytestWarning(f"llmbench {text}"), stacklevel=1)
    return []


def session_effect(runner: Runner, case: Case, metric: str, on: str | None = None) -> budget.SessionEffect:
    """The session effect on the case's ``metric`` the store's earlier sessions show
    (budget.session_effect over each session's log trial values of the same case), of those measured
    on the machine ``on`` (history.machine) when given: another machine's spread is not this one's."""
    sessions = []
    for stored in runner.session.store.earlier().values():
        values = [v for _, r in stored
                  if r.ok and r.case_id == case.spec.case_id and r.spec.identity() == case.spec.identity()
                  and (on is None or machine(r.env) == on)
                  and isinstance(v := r.metrics.get(metric), (int, float)) and v > 0]
        if values:
            sessions.append([math.log(v) for v in values])
    return budget.session_effect(sessions)


def history(runner: Runner, case: Case, metric: str, on: str | None = None
            ) -> tuple[float, float | None, int]:
    """(session effect variance, one session's variance across the store or None, its degrees of
    freedom) of the case's ``metric`` in the store's earlier sessions (``session_effect``): what the
    memory budget and the scaling floor judge with beside the trials' own spread."""
    effect = session_effect(runner, case, metric, on)
    return effect.variance, effect.total_var, effect.total_df
