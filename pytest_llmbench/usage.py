"""What a session's options must agree on before any case runs (pytest_configure and collection, in
plugin.py): each refusal a usage error naming the flag, variable or ini key it came from.

    output_folder  the output folder takes files (and a dry run's is new or its own)
    gate_options   the gate's options agree; --llmbench-ab's sides made ready, --llmbench-compare's found
    auto_marker    ``-m auto`` on a host no profile is made for says so
"""

from __future__ import annotations

import pytest

from pytest_llmbench import ab, budget, dryrun, gates
from pytest_llmbench.cases import host_profiles
from pytest_llmbench.session import BenchSession
from pytest_llmbench.store import output_problem


def output_folder(settings) -> None:
    """The output folder takes files, or a usage error naming it and where it came from."""
    problem = output_problem(settings.output)
    where = settings.sources["output"]
    where = "--llmbench-output (default)" if where == "default" else where
    if problem:
        raise pytest.UsageError(f"{where}: {problem}")
    if settings.dry_run:
        dryrun.check_folder(settings, where)

def gate_options(settings, session: BenchSession, launcher) -> None:
    """The gate's options agree (a UsageError naming them otherwise); --llmbench-ab's sides are made
    ready to run (ab.py), --llmbench-compare's session found."""
    if settings.fail_below and not (settings.compare or settings.ab):
        raise pytest.UsageError(f"{settings.sources['fail_below']}: needs --llmbench-ab (a baseline side run "
                                f"in this session) or --llmbench-compare (a stored run) to gate against")
    if settings.compare and settings.ab:
        raise pytest.UsageError(f"{settings.sources['ab']}: gates against a side run in this session; "
                                f"{settings.sources['compare']} against a stored one: choose one")
    if settings.trials_max and not settings.fail_below:
        raise pytest.UsageError(f"{settings.sources['trials_max']}: only adds trials to settle the "
                                f"--llmbench-fail-below gate, which is not set")
    if settings.trials_max and settings.trials and settings.trials_max < settings.trials:
        raise pytest.UsageError(f"{settings.sources['trials_max']}: {settings.trials_max} is below the "
                                f"{settings.trials} trials of {settings.sources['trials']}; the cap must be "
                                f"at least the trials every case runs")
    first_look = gates.ab_first_look(settings)
    if settings.ab and settings.trials_max and settings.trials_max < first_look:
        raise pytest.UsageError(f"{settings.sources['trials_max']}: {settings.trials_max} is below the "
                                f"{first_look} rounds of the A/B gate's first look (--llmbench-trials, "
                                f"default {budget.AB_FIRST}); the cap must be at least those rounds")
    if settings.compare:
        try:
            session.store.resolve_session(settings.compare)
        except FileNotFoundError as exc:
            raise pytest.UsageError(f"{settings.sources['compare']}: {exc}") from None
    if settings.ab:
        try:
            session.sides = ab.sides(settings, launcher, session.output, session.store.session_id)
        except ab.SideError as exc:
            raise pytest.UsageError(str(exc)) from None

def auto_marker(config: pytest.Config, bench: BenchSession) -> None:
    """``-m auto`` on a host no profile is made for: say so, never run another GPU's profile."""
    if "auto" not in (config.option.markexpr or "") or not bench.launcher.on_this_host:
        return
    if host_profiles(bench.profiles, bench.host_gpus):
        return
    known = "; ".join(f"{name}: {' or '.join(p.parts + p.device_names) or p.device}"
                      for name, p in bench.profiles.items())
    raise pytest.UsageError(
        f"-m auto: no profile is made for this host's GPU {bench.host_gpus[0]!r} (profiles and the GPU "
        f"parts they are for: {known}). Add one: a TOML file like pytest_llmbench/profiles/h100.toml "
        f"naming its part, passed as --llmbench-profile-file=FILE")
