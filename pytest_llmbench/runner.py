"""The ``llmbench`` fixture: a Runner whose ``run(case)`` launches a case and records it.

    def test_training(llmbench, llmbench_case):
        result = llmbench.run(llmbench_case)   # launch, enrich, store, pytest-benchmark stats
        llmbench.check(result)                 # status, memory budget, scaling, regressions

With several trials per case each trial is its own test item (cases.interleave orders
them); a trial's item checks that trial's status, and the item of the last trial checks
the thresholds on the aggregate of all trials (trials.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets

import pytest

from harness.derive_after import with_cost, with_overhead_split, with_plugin_metrics, with_scaling
from harness.result import BenchResult
from pytest_llmbench import (
    benchmark_json,
    compare_gate,
    dryrun,
    gate_rules,
    gates,
    hostlock,
    trials,
    verdicts,
)
from pytest_llmbench.ab import Side
from pytest_llmbench.cases import Case
from pytest_llmbench.launchers import Interrupted
from pytest_llmbench.launchers.base import STOPS
from pytest_llmbench.machine import machine
from pytest_llmbench.session import SESSION_KEY, BenchSession, git_commit
from pytest_llmbench.settings import Settings


class Runner:
    def __init__(self, session: BenchSession, request: pytest.FixtureRequest) -> None:
        self.session, self.request = session, request
        self.settings = session.settings
        self._reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        self.case: Case | None = None  # set by run(); check() checks that case

    def run(self, case: Case) -> BenchResult:
        """Launch the case (and its scaling baseline first, if none is known) and record it."""
        self.case = case
        if self.settings.dry_run:  # written, never run (dryrun.py)
            folder, refused, warnings = dryrun.write_case(self, case)
            for warning in warnings:
                self.say(f"{case.label}: dry run: WARNING: {warning}")
            if refused:  # what a real run would record as the case's error
                pytest.fail(f"dry run: the {self.session.launcher.name} launcher would refuse this case: "
                            f"{refused} (written to {folder})", pytrace=False)
            self.say(f"{case.label}: dry run: its spec and what {self.session.launcher.name} would run, in "
                     f"{folder}")
            pytest.skip(f"dry run: written to {folder}")
        if case.spec.benchmark == "collectives":  # nothing to scale against
            result = self._launch(case, baseline=None)
        elif self.session.sides:  # A/B: rounds on both sides (gates.py)
            result = gates.ab_rounds(self, case)
        else:
            result = self.launch_with_baseline(case)
        benchmark_json.record(self.request, case, result)
        return result

    def launch_side(self, case: Case, side: Side, *, first: bool) -> BenchResult:
        """One round's launch of the case on an A/B side: the candidate as any trial (its first with
        its scaling baseline run if none is known), the baseline side on its own launcher, interpreter,
        environment and warm ranks, stored apart (session.record_side)."""
        if side.name == "candidate":
            if case.spec.world_size != base_ws(case) and case.profile.min_scaling_efficiency.get(
                    case.spec.world_size) is not None:
                return self._beside_its_baseline(case)
            if first:
                return self.launch_with_baseline(case)
            base = self.session.find_baseline(case.profile.name, case.spec, case.profile.baseline_world_size,
                                              trial=case.trial, any_trial=True)
            return self._launch(case, baseline=base if case.spec.world_size != base_ws(case) else None)
        return self._launch(case, baseline=None, side=side)

    def _beside_its_baseline(self, case: Case) -> BenchResult:
        """An A/B round of a case with a scaling floor: the candidate at the baseline world size runs in
        the same round, before the case in odd rounds and after it in even ones (a drift within the
        round cancels too), and the case pairs with it. The baseline's own test ran its rounds minutes
        earlier; paired with those, a drift between the two tests read as efficiency (issue 66: 20-29%
        false alarms, experiments/ab-scaling-pairing). Stored as that round's trial of the baseline
        case (the latest launch of a trial index is the one its trials read)."""
        first, ws0 = case.at_world_size(base_ws(case)), base_ws(case)
        self.say(f"{case.label}: the scaling floor pairs it with {first.label}, run beside it in this round")
        if case.trial % 2:
            baseline = self._launch(first, baseline=None)
            reason = None if baseline.ok else f"baseline ws{ws0} failed: {baseline.status}: {baseline.error}"
            return self._launch(case, baseline=baseline if baseline.ok else None, reason=reason)
        result = self._launch(case, baseline=None, reason=f"its round's ws{ws0} runs after it; paired when "
                                                          f"that has run")
        baseline = self._launch(first, baseline=None)
        if not result.ok:
            return result
        if not baseline.ok:
            reason = f"baseline ws{ws0} failed: {baseline.status}: {baseline.error}"
            return self._paired_with(case, result, None, reason)
        return self._paired_with(case, result, baseline, None)

    def _paired_with(self, case: Case, result: BenchResult, baseline: BenchResult | None,
                     reason: str | None) -> BenchResult:
        """``result`` with its scaling efficiency and overhead split against ``baseline`` (run after it),
        put in place of the recorded one and stored again."""
        base, reason = _comparable(baseline, result), reason or _mismatch(baseline, result)
        paired = with_plugin_metrics(with_overhead_split(with_scaling(result, base, reason), base, reason))
        self.session.replace(case.profile.name, paired)
        return paired

    def launch_with_baseline(self, case: Case) -> BenchResult:
        baseline_ws = case.profile.baseline_world_size
        baseline = reason = None
        if case.spec.world_size != baseline_ws and (case.group, case.trial) in self.session.baseline_last:
            # this round runs the world sizes down to the baseline (cases.interleave): the baseline
            # of this round runs after this case and then pairs with it (_pair_earlier)
            reason = (f"its round's ws{baseline_ws} baseline runs after it (world sizes reversed in "
                      f"alternate rounds); paired when that has run")
        elif case.spec.world_size != baseline_ws:
            # the same trial's baseline; a single-trial case may also use any earlier or stored one
            baseline = self.session.find_baseline(case.profile.name, case.spec, baseline_ws,
                                                  trial=case.trial, any_trial=case.trials == 1)
            if baseline is None:
                first = case.at_world_size(baseline_ws)
                self.say(f"{case.label}: no ws{baseline_ws} baseline of this trial in this session"
                         f"{' or the store' if case.trials == 1 else ''}; running {first.label} first "
                         f"for scaling efficiency")
                baseline = self._launch(first, baseline=None)
                if not baseline.ok:
                    reason = f"baseline ws{baseline_ws} failed: {baseline.status}: {baseline.error}"
        return self._launch(case, baseline=baseline, reason=reason)

    def _launch(self, case: Case, *, baseline: BenchResult | None, reason: str | None = None,
                side: Side | None = None) -> BenchResult:
        run_id = f"{case.id}-{'baseline-' if side is not None else ''}{secrets.token_hex(3)}"
        env = {**case.profile.env, "LLMBENCH_GIT_COMMIT": git_commit() or ""}
        timeout = self.settings.timeout or case.profile.timeout_s
        kind = self.session.launcher
        settings = self.settings
        if side is not None:  # the baseline side: its launcher options, interpreter and environment
            env |= side.env | {"LLMBENCH_GIT_COMMIT": side.facts.get("commit") or ""}
            settings = Settings({**settings.values, **side.settings}, settings.sources)
        on_host = side is not None and kind.make_on_host is not None  # the side's interpreter and folder
        launcher = (kind.make_on_host(settings, case.profile, side.host) if on_host
                    else kind.make(settings, case.profile))
        label = case.label + (f" [baseline {side.spelled}]" if side is not None else "")
        self.say(f"{label}: launching on {kind.name} (timeout {timeout:g} s)")
        exclusive = (hostlock.exclusive(run_id, say=lambda line: self.say(f"{label}: {line}"))
                     if kind.host_lock else contextlib.nullcontext())
        try:
            # a second Ctrl-C waits while the first stops this case and its result is stored
            with STOPS.case(), exclusive:  # one measured case at a time on this host (hostlock.py)
                try:
                    result = launcher.run(case.spec, run_dir=self.session.output / "runs" / run_id,
                                          run_id=run_id, timeout_s=timeout, env=env,
                                          progress=lambda line: self.say(f"{label}: {line}"))
                except Interrupted as exc:
                    self.session.record(case.profile.name, exc.result.replace(
                        trial=case.trial, env={**exc.result.env, "launcher": kind.name,
                                               **session_labels(self.settings)}))
                    if STOPS.waited:
                        self.say(f"{label}: {STOPS.waited} more stop signal(s) came while the case was "
                                 f"stopped; they waited until its result was stored")
                    raise
        except OSError as exc:  # the run folder could not be written: a full disk, an I/O error
            result = BenchResult.failure(case.spec, status="error", run_id=run_id,
                                         error=f"could not write the case's files under "
                                               f"{self.session.output / 'runs' / run_id}: {exc}")
        # which launcher ran it: the report keeps the same case run by two launchers apart
        ab = {"ab_side": "candidate"} if self.session.sides else {}
        result = result.replace(trial=case.trial, env={**result.env, "launcher": kind.name, **ab,
                                                       **session_labels(self.settings)})
        if side is not None:
            result = result.replace(env={**result.env, "ab_side": side.name, "ab": side.spelled})
            self.session.record_side(case.profile.name, result)
            self.say(f"{label}: {result.status} in {result.wall_time_s or 0:.1f} s")
            return result
        if case.spec.benchmark == "train":
            result = with_cost(result, case.profile.usd_per_device_hour)
            if case.spec.world_size == base_ws(case):
                baseline, reason = result, ""  # E(N0) = 1 and no exposed communication, by definition
            else:
                baseline, reason = _comparable(baseline, result), reason or _mismatch(baseline, result)
            result = with_overhead_split(with_scaling(result, baseline, reason), baseline, reason)
            result = with_plugin_metrics(result)
        self.session.record(case.profile.name, result)
        self.say(f"{case.label}: {result.status} in {result.wall_time_s or 0:.1f} s")
        if case.spec.benchmark == "train" and case.spec.world_size == case.profile.baseline_world_size:
            self._pair_earlier(case, result)
        return result

    def _pair_earlier(self, case: Case, baseline: BenchResult) -> None:
        """The scaled cases of this round that ran before their baseline (a round with the world
        sizes reversed) get their scaling efficiency and overhead split against it now, stored again."""
        if (case.group, case.trial) not in self.session.baseline_last:
            return  # (an A/B session has no reversed rounds: each case's rounds run in its own test)
        identity = case.spec.scaling_identity()
        for profile, result in list(self.session.records):
            if (profile != case.profile.name or result.trial != case.trial or not result.ok
                    or result.spec.world_size == baseline.spec.world_size
                    or result.spec.scaling_identity() != identity
                    or result.metrics.get("scaling_efficiency") is not None):
                continue
            paired = self._paired_with(case, result, baseline, None)
            efficiency = paired.metrics.get("scaling_efficiency")
            self.say(f"{case.label}: paired with ws{result.spec.world_size} of this round, which ran before "
                     f"it: scaling efficiency " + (f"{efficiency:.3f}" if efficiency is not None
                                                   else paired.null_reasons.get("scaling_efficiency", "?")))

    def check(self, result: BenchResult) -> None:
        """Fail the test with every broken threshold named (status, memory, scaling, regression).

        A trial before the case's last checks only its own status; the last trial's item checks
        the aggregate of all the case's trials in this session.
        """
        unsaved = self.session.unsaved.get(result.run_id)
        if not result.ok:
            pytest.fail(result.describe_failure() + (f"\n{unsaved}" if unsaved else ""), pytrace=False)
        if unsaved:
            pytest.fail(unsaved, pytrace=False)
        case = self.case
        if case is None:
            raise RuntimeError("llmbench.check(result) checks the case that llmbench.run() ran in this test")
        if case.trial < case.trials:
            self.say(f"{case.label}: ok; thresholds are checked on all {case.trials} trials after the last")
            return
        profile = self.session.profiles[case.profile.name]
        if case.spec.benchmark == "collectives":
            failure = verdicts.busbw(result, profile)
            if failure:
                pytest.fail(failure, pytrace=False)
            return
        runs = self.session.trials_of(profile.name, result.case_id)
        ok = [r for r in runs if r.ok]
        alpha = self.session.budget.gate_alpha()  # each gate's share of the session's (budget.py)
        on = machine(ok[-1].env) if ok else None  # the store's sessions of this machine only
        memory = (compare_gate.history(self, case, "peak_memory_gib", on) if profile.max_peak_memory_gib
                  else None)
        failures = [verdicts.failed_trials(runs), verdicts.peak_memory(ok, profile, alpha, memory)]
        if profile.min_scaling_efficiency.get(result.spec.world_size) is not None:
            efficiency = self._efficiency(case, ok, alpha)
            failures.append(verdicts.scaling(*efficiency, result.spec.world_size, profile))
        gated = gates.ab_failures(self, case) if self.session.sides else compare_gate.stored(self, case, ok)
        failures = [f for f in failures if f] + gated
        if case.trials > 1 or len(ok) > 1:  # the gate may have added trials
            benchmark_json.add_aggregate(self.request, trials.extra_info(
                self.session.trials_of(profile.name, result.case_id)))
        if failures:
            pytest.fail(f"{result.case_id}: " + "; ".join(failures), pytrace=False)

    def _efficiency(self, case: Case, ok: list[BenchResult], alpha: float) -> tuple[bool | None, str]:
        """(fails the floor?, the words) for the case's trials against the profile's scaling floor,
        with the gate's false-alarm budget (trials.efficiency_check); None when unknown."""
        profile = case.profile
        floor = profile.min_scaling_efficiency[case.spec.world_size]
        if not ok:
            return None, "no trial finished"
        if len(ok) == 1 and ok[0].metrics.get("scaling_efficiency") is None:
            return None, ok[0].null_reasons.get("scaling_efficiency", "not computed")
        base = [r for r in self.session.trials_of(profile.name, case.at_world_size(
            profile.baseline_world_size).spec.case_id) if r.ok]
        session_var, total, df = compare_gate.history(self, case, "scaling_efficiency", machine(ok[-1].env))
        seen = {"session_var": session_var, "history": (total, df) if total is not None else None}
        if base:
            verdict = trials.efficiency_check(ok, base, floor, noise_cv=profile.launch_noise_cv, alpha=alpha,
                                              **seen)
        else:  # one trial against a stored baseline: its own efficiency, two launches behind it
            verdict = gate_rules.floor_check([math.log(ok[0].metrics["scaling_efficiency"])], floor,
                                        noise_cv=profile.launch_noise_cv, alpha=alpha, **seen)
        return verdict.outcome == "fail", verdict.text

    def last_trial(self, case: Case) -> int:
        """The highest trial index of the case run in this session (failed trials count)."""
        return max((r.trial for r in self.session.trials_of(case.profile.name, case.spec.case_id)), default=0)

    def say(self, text: str) -> None:
        """A progress line on the terminal, past pytest's output capture."""
        if self._reporter is None:
            return
        capman = self.request.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            self._reporter.write_line(f"[llmbench] {text}")


def base_ws(case: Case) -> int:
    return case.profile.baseline_world_size


def _comparable(baseline: BenchResult | None, result: BenchResult) -> BenchResult | None:
    return None if _mismatch(baseline, result) else baseline


def _mismatch(baseline: BenchResult | None, result: BenchResult) -> str:
    if baseline is None:
        return "no baseline run"
    if result.ok and baseline.env.get("device_name") != result.env.get("device_name"):
        return (f"stored baseline ran on {baseline.env.get('device_name')!r}, this case on "
                f"{result.env.get('device_name')!r}")
    return ""


@pytest.fixture
def llmbench(request: pytest.FixtureRequest) -> Runner:
    """Launches benchmark cases and checks them against their profile's thresholds."""
    return Runner(request.config.stash[SESSION_KEY], request)


def session_labels(settings) -> dict[str, str]:
    """What the history keys and filters a stored result by, beyond what its ranks saw: the runner label
    (--llmbench-runner) and, in a bisect's step session, the commit it was testing (never history)."""
    from pytest_llmbench.bisect import STEP_ENV

    labels = {"runner": settings.values["runner"]} if settings.values.get("runner") else {}
    if os.environ.get(STEP_ENV):
        labels["bisect_step"] = os.environ[STEP_ENV][:40]
    return labels
