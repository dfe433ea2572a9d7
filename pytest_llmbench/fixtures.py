"""The ``llmbench`` fixture: a Runner whose ``run(case)`` launches a case and records it.

    def test_training(llmbench, llmbench_case):
        result = llmbench.run(llmbench_case)   # launch, enrich, store, pytest-benchmark stats
        llmbench.check(result)                 # status, memory budget, scaling, regressions
"""

from __future__ import annotations

import contextlib
import secrets

import pytest

from harness.result import BenchResult, with_cost, with_scaling
from pytest_llmbench import benchmark_json, hostlock
from pytest_llmbench.cases import Case
from pytest_llmbench.launchers import Interrupted, make_launcher
from pytest_llmbench.session import SESSION_KEY, BenchSession, git_commit


class Runner:
    def __init__(self, session: BenchSession, request: pytest.FixtureRequest) -> None:
        self.session, self.request = session, request
        self.settings = session.settings
        self._reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def run(self, case: Case) -> BenchResult:
        """Launch the case (and its scaling baseline first, if none is known) and record it."""
        profile = case.profile
        baseline_ws = profile.baseline_world_size
        baseline = reason = None
        if case.spec.world_size != baseline_ws:
            baseline = self.session.find_baseline(profile.name, case.spec, baseline_ws)
            if baseline is None:
                self.say(f"{case.id}: no ws{baseline_ws} baseline in this session or the store; "
                         f"running {case.at_world_size(baseline_ws).id} first for scaling efficiency")
                baseline = self._launch(case.at_world_size(baseline_ws), baseline=None)
                if not baseline.ok:
                    reason = f"baseline ws{baseline_ws} failed: {baseline.status}: {baseline.error}"
        result = self._launch(case, baseline=baseline, reason=reason)
        benchmark_json.record(self.request, case, result)
        return result

    def _launch(self, case: Case, *, baseline: BenchResult | None, reason: str | None = None,
                ) -> BenchResult:
        run_id = f"{case.id}-{secrets.token_hex(3)}"
        env = {**case.profile.env, "LLMBENCH_GIT_COMMIT": git_commit() or ""}
        timeout = self.settings.timeout or case.profile.timeout_s
        launcher = make_launcher(self.settings.launcher, self.settings)
        self.say(f"{case.id}: launching on {self.settings.launcher} (timeout {timeout:g} s)")
        exclusive = (hostlock.exclusive(run_id, say=lambda line: self.say(f"{case.id}: {line}"))
                     if self.settings.launcher == "local" else contextlib.nullcontext())
        try:
            with exclusive:  # one measured case at a time on this host (hostlock.py)
                result = launcher.run(case.spec, run_dir=self.session.output / "runs" / run_id,
                                      run_id=run_id, timeout_s=timeout, env=env,
                                      progress=lambda line: self.say(f"{case.id}: {line}"),
                                      placement=case.profile.k8s, placement_source=case.profile.source)
        except Interrupted as exc:
            self.session.record(case.profile.name, exc.result)
            raise
        result = with_cost(result, case.profile.usd_per_device_hour)
        if case.spec.world_size == case.profile.baseline_world_size:
            result = with_scaling(result, result)  # E(N0) = 1 by definition
        else:
            result = with_scaling(result, _comparable(baseline, result),
                                  reason or _mismatch(baseline, result))
        self.session.record(case.profile.name, result)
        self.say(f"{case.id}: {result.status} in {result.wall_time_s or 0:.1f} s")
        return result

    def check(self, result: BenchResult) -> None:
        """Fail the test with every broken threshold named (status, memory, scaling, regression)."""
        if not result.ok:
            pytest.fail(result.describe_failure(), pytrace=False)
        profile = self.session.profiles[_profile_of(self.session, result)]
        m, failures = result.metrics, []
        budget = profile.max_peak_memory_gib
        if budget is not None and m["peak_memory_gib"] is not None and m["peak_memory_gib"] > budget:
            failures.append(f"peak memory {m['peak_memory_gib']:.3f} GiB exceeds the {profile.name} "
                            f"budget of {budget:g} GiB ({m['peak_memory_kind']})")
        floor = profile.min_scaling_efficiency.get(result.spec.world_size)
        if floor is not None:
            eff = m.get("scaling_efficiency")
            if eff is None:
                why = result.null_reasons.get("scaling_efficiency")
                failures.append(f"scaling efficiency unknown ({why}); the {profile.name} profile "
                                f"requires >= {floor:g}")
            elif eff < floor:
                failures.append(f"scaling efficiency {eff:.3f} at ws{result.spec.world_size} is below "
                                f"the {profile.name} threshold {floor:g}")
        failures += self._regressions(profile.name, result)
        if failures:
            pytest.fail(f"{result.case_id}: " + "; ".join(failures), pytrace=False)

    def _regressions(self, profile: str, result: BenchResult) -> list[str]:
        if not self.settings.fail_below:  # plugin.pytest_configure made sure --llmbench-compare is set
            return []
        before = self.session.compared(profile, result.case_id)
        if before is None or not before.ok:
            self.session.notes.append(f"{result.case_id}: not in the compared run; no regression gate")
            return []
        out = []
        for metric, pct in self.settings.fail_below:
            old, new = before.metrics.get(metric), result.metrics.get(metric)
            if old is None or new is None:
                self.session.notes.append(f"{result.case_id}: {metric} empty; gate skipped")
            elif new < old * (1 - pct / 100):
                out.append(f"{metric} {new:.4g} is {100 * (1 - new / old):.1f}% below the compared "
                           f"run's {old:.4g} (allowed {pct:g}%)")
        return out

    def say(self, text: str) -> None:
        """A progress line on the terminal, past pytest's output capture."""
        if self._reporter is None:
            return
        capman = self.request.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            self._reporter.write_line(f"[llmbench] {text}")


def _comparable(baseline: BenchResult | None, result: BenchResult) -> BenchResult | None:
    return None if _mismatch(baseline, result) else baseline


def _mismatch(baseline: BenchResult | None, result: BenchResult) -> str:
    if baseline is None:
        return "no baseline run"
    if result.ok and baseline.env.get("device_name") != result.env.get("device_name"):
        return (f"stored baseline ran on {baseline.env.get('device_name')!r}, this case on "
                f"{result.env.get('device_name')!r}")
    return ""


def _profile_of(session: BenchSession, result: BenchResult) -> str:
    for profile, recorded in reversed(session.records):
        if recorded.run_id == result.run_id:
            return profile
    raise LookupError(f"result {result.run_id} was not recorded in this session")


@pytest.fixture
def llmbench(request: pytest.FixtureRequest) -> Runner:
    """Launches benchmark cases and checks them against their profile's thresholds."""
    return Runner(request.config.stash[SESSION_KEY], request)
