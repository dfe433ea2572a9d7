"""The regression gates (--llmbench-fail-below METRIC:PCT), out of the Runner that launches cases.

Two ways to gate a change, with one error rate for the whole session:

- **A/B in one session** (``--llmbench-ab SIDE``, pytest_llmbench/ab.py), the way to gate a change:
  each case runs in rounds on both sides, A then B, then B then A (ABBA...), on the same machine.
  Round r gives one paired log ratio log(candidate_r / baseline_r); a drift of the machine between
  rounds moves both and cancels. The verdict is ``stats.paired_gate`` on those ratios: the spread
  is the rounds' own, measured (the profile's ``launch_noise_cv`` only plans the round count before
  any round has run). Looks at ``--llmbench-trials`` rounds (default AB_FIRST), doubling, up to
  ``--llmbench-trials-max`` (default AB_CAP); each look spends alpha / looks (Bonferroni alpha
  spending: valid whenever the gate stops). An undecided gate at its cap says what it would have
  needed.
- **Against a stored session** (``--llmbench-compare SESSION``): the case's trials now against its
  trials then, ``stats.gate``. It assumes no session effect: a machine busier or idler than when
  the stored session ran looks like the code; its message says so, with the session-to-session
  spread the store shows for the case where it holds earlier sessions.

**One error rate per session**: every gate (case x metric) runs at ``SESSION_ALPHA / gates``
(Bonferroni), so a session of clean cases fails anywhere at most SESSION_ALPHA of the time, under
any dependence between cases. Holm's step-down or Benjamini-Hochberg would be less strict, but they
order every gate's p-value before any verdict, and a pytest session decides each case's test as it
finishes; Bonferroni is Holm's first step, the one that can be taken case by case.
"""

from __future__ import annotations

import functools
import math
import statistics
import warnings
from typing import Any, Protocol

import pytest

from harness.result import BenchResult
from pytest_llmbench import stats, trials
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

SESSION_ALPHA = stats.ALPHA  # a session of clean cases fails anywhere at most this often
AB_FIRST = 4  # rounds at the A/B gate's first look (3 degrees of freedom)
AB_CAP = 16  # rounds at its last look (looks at 4, 8 and 16: each at a third of the budget)


def gate_alpha(n_gates: int) -> float:
    """Each gate's false-alarm budget: the session's, split evenly over its gates (Bonferroni)."""
    return SESSION_ALPHA / max(1, n_gates)


def error_rate_line(n_gates: int) -> str:
    return (f"gates: {n_gates} (cases x metrics); a session of clean cases fails anywhere at most "
            f"{SESSION_ALPHA:.0%} of the time (Bonferroni: each gate at {gate_alpha(n_gates):.2%})")


# ---- A/B in one session -----------------------------------------------------------------------

def ab_first_look(settings) -> int:
    """Rounds at the A/B gate's first look: --llmbench-trials, else AB_FIRST (two at least: a spread)."""
    return max(settings.trials or AB_FIRST, 2)


def ab_rounds(runner: Runner, case: Case) -> BenchResult:
    """Run the case's rounds on both sides until every gate decides (or the cap); the candidate's
    last result. The verdicts go to the session (``ab_verdicts``), checked by ``ab_failures``."""
    session, settings = runner.session, runner.settings
    first = ab_first_look(settings)
    # with no gate: the first look's rounds, for the report's paired ratios
    cap = max(settings.trials_max or AB_CAP, first) if settings.fail_below else first
    alpha = gate_alpha(session.n_gates)
    runner.say(f"{case.name}: A/B against {session.sides['baseline'].spelled}; "
               + rounds_plan(case, settings.fail_below or [], stats.looks(first, cap), alpha))
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

    def said(r: int, verdicts: dict[str, stats.GateVerdict]) -> None:
        runner.say(f"{case.name}: round {r}: " + "; ".join(
            f"{m} {v.outcome} (new/old {v.ratio.value:.3f})" for m, v in verdicts.items()))

    rounds, verdicts = sequential(one_round, settings.fail_below or [], first=first, cap=cap, alpha=alpha,
                                  progress=said)
    session.ab_verdicts[case.name] = (rounds, verdicts)
    return last[0]


def sequential(one_round, gated: list[tuple[str, float]], *, first: int, cap: int, alpha: float,
               progress=lambda r, verdicts: None) -> tuple[int, dict[str, stats.GateVerdict]]:
    """The A/B gate's loop: ``one_round(r)`` gives round r's (candidate metrics, baseline metrics), or
    None when a side failed (the loop ends); at each planned look (``stats.looks(first, cap)``) every
    gate of ``gated`` [(metric, allowed drop %)] is judged on the rounds so far (``stats.paired_gate``,
    ``alpha`` spent over the looks); it stops once all decide. (rounds run, verdicts at the last look).
    The Runner launches the rounds; tests/unit/test_gates.py draws them."""
    points = stats.looks(first, cap)
    ratios: dict[str, list[float]] = {metric: [] for metric, _ in gated}
    verdicts: dict[str, stats.GateVerdict] = {}
    rounds = 0
    for r in range(1, cap + 1):
        pair = one_round(r)
        if pair is None:
            break
        rounds = r
        for metric in ratios:
            ratios[metric] += stats.paired_log_ratios([(pair[0].get(metric), pair[1].get(metric))])
        if r in points and gated:
            verdicts = {metric: stats.paired_gate(ratios[metric], pct / 100, n_looks=len(points),
                                                  last_look=r >= cap, alpha=alpha) for metric, pct in gated}
            if all(v.outcome != "inconclusive" for v in verdicts.values()):
                break
            progress(r, verdicts)
    return rounds, verdicts


def rounds_plan(case: Case, gated: list[tuple[str, float]], points: list[int], alpha: float) -> str:
    """Power by design, before any round: the rounds that decide at the planned noise (the profile's
    launch_noise_cv on each side of a round, nothing cancelled: an upper bound on the paired spread)."""
    cv = case.profile.launch_noise_cv
    sd = math.sqrt(2) * math.log1p(cv)
    return (f"looks at {', '.join(map(str, points))} rounds, each gate at false-alarm budget {alpha:.2%}; "
            f"planned from launch_noise_cv {cv:.0%} (paired sd <= {sd:.3f}): " + "; ".join(
                f"{metric} catches a {2 * pct:.0f}% drop with {stats.POWER:.0%} power by round "
                + str(stats.rounds_for_paired_gate(sd, pct / 100, looks_at=points, alpha=alpha)
                      or f"> {points[-1]} (the measured spread decides)")
                for metric, pct in gated))


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
                f"allowed drop {pct:g}%: {verdict.text}")
        session.notes.append(f"{case.name}: {metric}: A/B {verdict.outcome} (new/old "
                             f"{verdict.ratio.value:.3f}, {rounds} rounds)")
        if verdict.outcome == "fail":
            out.append(text)
        elif verdict.outcome == "inconclusive":
            sd = statistics.stdev(log_ratios_of(session, case, metric)) if rounds > 1 else None
            need = stats.rounds_needed(sd, pct / 100, alpha=gate_alpha(session.n_gates)) if sd else None
            text += f"; at the measured spread it would need {need or 'more than 10,000'} rounds"
            warnings.warn(pytest.PytestWarning(f"llmbench {case.name}: {text}"), stacklevel=1)
    return out


def log_ratios_of(session, case: Case, metric: str) -> list[float]:
    """The case's rounds' log(candidate / baseline) of ``metric``, from the session's records."""
    bases = {r.trial: r for r in session.side_trials(case.profile.name, case.spec.case_id) if r.ok}
    return stats.paired_log_ratios([(cand.metrics.get(metric), bases[cand.trial].metrics.get(metric))
                                    for cand in session.trials_of(case.profile.name, case.spec.case_id)
                                    if cand.ok and cand.trial in bases])


# ---- against a stored session ------------------------------------------------------------------

def stored(runner: Runner, case: Case, ok: list[BenchResult]) -> list[str]:
    """--llmbench-fail-below against the compared run's trials of the case (stats.gate); an
    inconclusive gate runs more trials up to --llmbench-trials-max, then says so."""
    session, settings = runner.session, runner.settings
    if not settings.fail_below or not ok or not settings.compare:
        return []
    name = case.profile.name
    compared = [r for r in session.compared(name, case.spec.case_id) if r.ok]
    before = [r for r in compared if r.spec.identity() == case.spec.identity()]
    if not before:
        return _nothing_to_compare(session, case, compared)
    out = []
    for metric, pct in settings.fail_below:
        new, old = trials.values(ok, metric), trials.values(before, metric)
        if not new or not old:
            session.notes.append(f"{case.name}: {metric} empty; gate skipped")
            continue
        cap = max(settings.trials_max or 0, len(new))
        points = stats.looks(len(new), cap)  # decide at these trial counts (stats.looks)
        judge = functools.partial(stats.gate, old=old, allowed_drop=pct / 100,
                                  noise_cv=case.profile.launch_noise_cv, n_looks=len(points),
                                  alpha=gate_alpha(session.n_gates))
        verdict = judge(new, last_look=len(new) >= cap)
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
            new = trials.values(ok, metric)
            if len(new) in points:
                verdict = judge(new, last_look=len(new) >= cap)
        text = trials.gate_text(metric, pct, new, old, verdict) + "; " + session_effect(runner, case, metric,
                                                                                         pct / 100)
        if verdict.outcome == "fail":
            out.append(text)
        elif verdict.outcome == "inconclusive":
            session.notes.append(f"{case.name}: {text}")
            warnings.warn(pytest.PytestWarning(f"llmbench {case.name}: {text}"), stacklevel=1)
    return out


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


def session_effect(runner: Runner, case: Case, metric: str, allowed_drop: float) -> str:
    """The stored-session gate's assumption, and what the store says of it: the spread of the case's
    mean between the stored sessions that ran it (the session effect the gate cannot see)."""
    means = []
    for session_id in runner.session.store.sessions():
        if session_id == runner.session.store.session_id:
            continue
        values = [v for _, r in runner.session.store.load_session(session_id)
                  if r.ok and r.case_id == case.spec.case_id and r.spec.identity() == case.spec.identity()
                  and isinstance(v := r.metrics.get(metric), (int, float)) and v > 0]
        if values:
            means.append(statistics.fmean(math.log(v) for v in values))
    return session_effect_text(means, allowed_drop)


def session_effect_text(log_means: list[float], allowed_drop: float) -> str:
    """What the stored-session gate assumes, and whether the store's sessions of the case (their log
    means) say it holds: a session-to-session sd above half the allowed drop (on the log scale) moves
    a clean case past the floor often enough that the stated false-alarm rate does not hold."""
    said = ("assumes no session effect: a machine busier or idler than in the compared session moves "
            "new/old as the code would")
    if len(log_means) < 2:
        return said + " (the store holds fewer than two earlier sessions of this case to check it)"
    sd, limit = statistics.stdev(log_means), -0.5 * math.log1p(-allowed_drop)
    text = f"; the store's {len(log_means)} earlier sessions of this case spread {sd:.1%} (sd of log means)"
    if sd > limit:
        return (said + text + ", over half the allowed drop: its stated false-alarm rate does not hold "
                "here; gate with --llmbench-ab, which cancels it")
    return said + text + f", within half the allowed drop ({limit:.1%})"
