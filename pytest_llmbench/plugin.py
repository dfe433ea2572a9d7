"""pytest-llmbench: pytest hooks only. Imports neither torch nor deepspeed.

The work is done elsewhere: settings.py (options), profiles/ (what to run), cases.py
(the matrix), runner.py (the ``llmbench`` fixture and its Runner), session.py (state and summary),
launchers/ (where ranks run), report/ (CSV, plots, REPORT.md).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from harness import metrics
from pytest_llmbench import ab, benchmark_json, bisect, budget, gates, hostlock, launchers, usage
from pytest_llmbench.cases import (
    Case,
    InvalidCase,
    baseline_last,
    build_cases,
    host_profiles,
    interleave,
    local_gpus,
    skip_reason,
)
from pytest_llmbench.launchers.base import STOPS
from pytest_llmbench.profiles import ProfileError, load_profiles
from pytest_llmbench.runner import llmbench  # noqa: F401 - the fixture, registered with the plugin
from pytest_llmbench.session import SESSION_KEY, BenchSession
from pytest_llmbench.settings import add_options, resolve


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_llmbench import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


_LAUNCHERS_ADDED = pytest.StashKey[bool]()


def _settings(config: pytest.Config):
    """The options resolved, after the launchers, metrics and report sections of other plugins are
    registered (once)."""
    if not config.stash.get(_LAUNCHERS_ADDED, False):
        config.stash[_LAUNCHERS_ADDED] = True
        for added in config.hook.pytest_llmbench_launchers(config=config):
            for kind in added or ():
                launchers.register(kind)
        for added in config.hook.pytest_llmbench_metrics(config=config):
            for metric in added or ():
                metrics.register(metric)
        from pytest_llmbench.report import sections

        for added in config.hook.pytest_llmbench_report_sections(config=config):
            for section in added or ():
                sections.register(section)
    return resolve(config)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``pytest --llmbench-report``: rebuild the report from stored results and exit.
    ``pytest --llmbench-bisect GOOD..BAD``: bisect the range with A/B sessions (bisect.py) and exit."""
    settings = _settings(config)
    if (settings.bisect or settings.history_bisect) and bisect.STEP_ENV not in os.environ:  # not in a step
        return _bisect(config, settings)
    if not settings.report:
        return None
    usage.output_folder(settings)
    from pytest_llmbench.report import ReportError, build_report

    try:
        profiles = load_profiles(settings.profile_file)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        return build_report(settings.output, echo=print, sessions=settings.report_session, profiles=profiles)
    except ReportError as exc:
        raise pytest.UsageError(f"{settings.sources['report_session']}: {exc}") from None


def _bisect(config: pytest.Config, settings) -> int:
    where = settings.sources["bisect" if settings.bisect else "history_bisect"]
    if settings.bisect and settings.history_bisect:
        raise pytest.UsageError(f"{where}: a range, or {settings.sources['history_bisect']}: not both")
    for conflicting in ("dry_run", "compare", "report"):
        if settings.values.get(conflicting):
            raise pytest.UsageError(f"{where}: a bisect runs A/B sessions at each step; "
                                    f"{settings.sources[conflicting]} cannot go with it")
    if settings.ab:
        raise pytest.UsageError(f"{where}: each step runs A/B against the range's good end itself; leave "
                                f"out {settings.sources['ab']}")
    if not settings.fail_below:
        raise pytest.UsageError(f"{where}: needs --llmbench-fail-below METRIC:PCT (what counts as worse)")
    usage.output_folder(settings)
    span = settings.bisect or bisect.from_history(settings.output, settings.fail_below, print, where)
    cap = settings.trials_max or budget.AB_CAP  # the rounds a step's A/B gate runs to (gates.ab_rounds)
    return bisect.run(config, span, where, settings.output, cap) if span else 0


def pytest_configure(config: pytest.Config) -> None:
    settings = _settings(config)
    try:
        profiles = load_profiles(settings.profile_file)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, profile in profiles.items():
        config.addinivalue_line("markers", f"{name}: benchmark cases of the {name} profile "
                                           f"({profile.description})")
    for marker in sorted({m for p in profiles.values() for m in p.markers} - set(profiles)):
        config.addinivalue_line("markers", f"{marker}: benchmark cases of the profiles that name it in "
                                           f"their markers key")
    config.addinivalue_line("markers", "auto: benchmark cases of the profile made for this host's hardware "
                                       "(cpu without a GPU, else the profile whose parts include it)")
    for workload, what in (("pretrain", "every parameter trains"), ("lora", "LoRA adapters on a frozen base"),
                           ("qlora", "LoRA adapters on a 4-bit NF4 base")):
        config.addinivalue_line("markers", f"{workload}: benchmark cases of workload {workload} ({what})")
    config.addinivalue_line("markers", "collectives: the collectives probe (busbw of all_reduce, all_gather, "
                                       "reduce_scatter, broadcast; tests/benchmarks/test_collectives.py)")
    config.addinivalue_line("markers", "multinode: benchmark cases whose ranks span several nodes")
    for name, kind in launchers.kinds().items():
        if kind.marker:
            config.addinivalue_line("markers", f"{name}: benchmark cases run by the {name} launcher "
                                               f"({kind.doc})")
    usage.output_folder(settings)
    launcher = launchers.get(settings.launcher)
    problem = launcher.check(settings, profiles) or (hostlock.problem() if launcher.host_lock
                                                     and not settings.dry_run else None)
    if problem:
        raise pytest.UsageError(problem)
    session = BenchSession.create(settings, profiles)
    usage.gate_options(settings, session, launcher)
    session.cases = build_cases(profiles, settings)
    several = any(getattr(case, "trials", 1) > 1 for case in session.cases)
    if several and getattr(config.option, "dist", "no") != "no":
        where = settings.sources["trials"] if settings.trials else "a profile's trials key"
        raise pytest.UsageError(
            f"{where}: several trials per case, and pytest-xdist (-n/--dist) would spread a case's "
            f"trials over worker processes that cannot see each other's trials or keep the interleaved "
            f"order; run trials without -n (cases run one at a time per host anyway)")
    session.host_gpus = local_gpus() if launcher.on_this_host else []
    config.stash[SESSION_KEY] = session
    _handle_stop_signals(config)


# Ctrl-C, and what CI cancellation, timeout and schedulers send
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SAVED_HANDLERS = pytest.StashKey[dict]()


def _handle_stop_signals(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C: the running case's ranks are stopped and it is
    recorded, the summary printed, exit code 2; a second signal while that case is stored waits for
    it (launchers/base.StopSignals). Only where nobody else handles them (Python's own Ctrl-C handler
    counts as nobody)."""
    if threading.current_thread() is not threading.main_thread():
        return
    saved = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, None, signal.default_int_handler):
            saved[signum] = signal.signal(signum, STOPS.handle)
    config.stash[_SAVED_HANDLERS] = saved


def pytest_unconfigure(config: pytest.Config) -> None:
    for signum, handler in config.stash.get(_SAVED_HANDLERS, {}).items():
        signal.signal(signum, handler)


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    s = session.settings
    return [f"llmbench: launcher={s.launcher} output={s.output} "
            f"profiles={','.join(session.profiles)} session={session.store.session_id}",
            *(f"llmbench: {note}" for note in [hostlock.xdist_note(config.option)]
              if note and session.launcher.host_lock)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``llmbench_case``: the training cases; ``llmbench_probe``: the collectives probes."""
    for name, benchmark in (("llmbench_case", "train"), ("llmbench_probe", "collectives")):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, _params(metafunc.config.stash[SESSION_KEY], benchmark))


def _params(session: BenchSession, benchmark: str) -> list:
    launcher = session.launcher
    auto = host_profiles(session.profiles, session.host_gpus) if launcher.on_this_host else []
    params = []
    for case in session.cases:
        if getattr(getattr(case, "spec", None), "benchmark", "train") != benchmark:
            continue
        marks = [getattr(pytest.mark, name) for name in (case.profile.name, *case.profile.markers)]
        if isinstance(case, InvalidCase):  # an error only if selected: pytest_collection_finish
            marks.append(getattr(pytest.mark, case.workload))
            params.append(pytest.param(case, id=case.id, marks=marks))
            continue
        marks.append(pytest.mark.collectives if benchmark == "collectives"
                     else getattr(pytest.mark, case.spec.workload))
        if case.profile.name in auto:
            marks.append(pytest.mark.auto)
        if case.spec.nnodes > 1:
            marks.append(pytest.mark.multinode)
        if launcher.marker:
            marks.append(getattr(pytest.mark, launcher.name))
        reason = skip_reason(case, launcher, session.host_gpus)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: the rounds are those that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With several trials per case, run them in interleaved rounds (cases.interleave); the session
    remembers the rounds whose scaled cases run before their baseline (cases.baseline_last)."""
    items[:] = interleave(items, _case_of)
    bench = config.stash.get(SESSION_KEY, None)
    if bench is not None:
        selected = [c for item in items if isinstance(c := _case_of(item), Case)]
        bench.baseline_last = baseline_last(selected)
        bench.budget = budget.for_session(bench.settings, selected)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selected case that the options make invalid is a usage error (exit 4) naming them."""
    bench = session.config.stash.get(SESSION_KEY, None)
    if bench is None:
        return
    usage.auto_marker(session.config, bench)
    invalid = [case for item in session.items if isinstance(case := _case_of(item), InvalidCase)]
    if not invalid:
        return
    s = bench.settings
    chosen = [k for k in ("strategy", "world_size", "seq_len", "steps") if s.sources[k] != "default"]
    where = ", ".join(f"{k} from {s.sources[k]}" for k in chosen) or "profile defaults"
    more = f" (and {len(invalid) - 1} more selected case(s))" if len(invalid) > 1 else ""
    raise pytest.UsageError(f"invalid benchmark case {invalid[0].id} ({where}; profile "
                            f"{invalid[0].profile.source}): {invalid[0].problem}{more}")


def _case_of(item: pytest.Item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("llmbench_case") if callspec else None


def pytest_sessionfinish(session: pytest.Session) -> None:
    bench = session.config.stash.get(SESSION_KEY, None)
    if bench is not None:
        bench.launcher.finish()  # nothing a case started outlives the session (warm ranks)
        for side in bench.sides.values():
            ab.remove(side)  # an A/B baseline's worktree
    if bench is None or not bench.records:
        return
    suite = budget.suite_failures(bench)
    if suite:  # the session fails, though each case passed alone
        bench.notes.extend(f"FAILED {line}" for line in suite)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if bench.sides:
        bench.store.save_gates(gates.verdicts_json(bench, suite))
    bench.write_report()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    bench = config.stash.get(SESSION_KEY, None)
    if bench is not None and bench.settings.dry_run:
        folder = bench.output / "dry-run" / bench.store.session_id
        terminalreporter.write_line(f"llmbench dry run: every selected case's spec and what it would run "
                                    f"are in {folder}; nothing ran")
    if bench is None or not bench.records:
        return
    terminalreporter.write_sep("=", "llmbench results")
    rate = [bench.budget.line()] if bench.budget.count or bench.budget.suites else []
    for line in bench.summary_lines() + rate + bench.notes:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"results stored in {bench.store.session_dir}")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    bench = config.stash.get(SESSION_KEY, None)
    if bench is not None:
        machine_info["llmbench"] = benchmark_json.machine_info(bench.records)
