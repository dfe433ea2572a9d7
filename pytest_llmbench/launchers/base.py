"""What every launcher provides: run one spec, always return a BenchResult; and what the plugin knows of
a launcher (``LauncherKind``), which each launcher module declares and launchers/__init__ registers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.result import EXIT_RUN_FAILED, BenchResult
from harness.spec import RunSpec
from pytest_llmbench.launchers.oom import NO_EVIDENCE

if TYPE_CHECKING:
    from pytest_llmbench.options import Option

Progress = Callable[[str], None]
LOG_TAIL_LINES = 40
STOPPED_BY_TORCHRUN = -signal.SIGTERM  # how torchrun ends the other ranks once one has failed
# one entry of torchrun's ChildFailedError listing: "rank : 1 (local_rank: 0)" then "exitcode : 3"
TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)")


def host_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a case's processes on this host: the case's ``env`` (its profile's [env]
    and the plugin's own variables) under this process's own. A profile describes a typical host
    and the user's shell describes this one, so an exported variable wins over the profile's value
    (``export NCCL_SOCKET_IFNAME=ens3`` on a host whose NIC is not the profile's). Launchers whose
    ranks inherit this process's environment (local, warm, slurm) start them with this; a pod
    inherits nothing from it and gets the profile's values (k8s)."""
    return {**env, **os.environ}


class Launcher(Protocol):
    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress) -> BenchResult:
        """Run the case to the end, in ``run_dir``, with ``env`` added to the ranks' environment,
        stopped after ``timeout_s``. A crash, OOM, hang or lost pod is a result, not an exception;
        Ctrl-C stops the ranks and raises Interrupted with the case's result."""


@dataclass(frozen=True)
class LauncherKind:
    """What the plugin needs to know of a launcher.

    ``make(settings, profile)`` builds the launcher for one case of that profile (a launcher reads
    its own options from ``settings`` and its profile table from ``profile.launch[name]``).
    ``check(settings, profiles)`` says, before anything runs, why this launcher cannot work with
    these settings and profiles (None when it can). ``parse_table(table, bad)`` validates the
    profile's ``[<profile_table>]`` table; ``bad(key, why)`` makes the error naming the profile file.
    """

    name: str
    doc: str
    make: Callable[[Any, Any], Launcher]
    options: tuple[Option, ...] = ()
    profile_table: str | None = None
    parse_table: Callable[[Any, Callable[[str, str], Exception]], dict] | None = None
    host_lock: bool = False  # one measured case at a time on this host (hostlock.py)
    on_this_host: bool = False  # ranks run here: this host's GPUs decide skips and -m auto
    spans_nodes: bool = False  # can run a case whose ranks span several nodes
    marker: bool = False  # its cases carry a pytest marker of its name
    owned_env: tuple[str, ...] = ()  # variables it sets for every rank (fnmatch patterns): no profile may
    check: Callable[[Any, dict], str | None] = lambda settings, profiles: None
    finish: Callable[[], None] = lambda: None  # at the session's end: release what it kept (warm ranks)
    # --llmbench-ab (pytest_llmbench/ab.py): the side kinds it can run. env= (extra environment) runs on
    # any launcher; image= changes a launcher option (side settings); ref= and python= start the ranks
    # with another folder or interpreter on this host, through make_on_host(settings, profile, host)
    # (host: launchers/local/warm.Host), which a launcher that runs them must provide.
    ab_sides: tuple[str, ...] = ("env",)
    make_on_host: Callable[[Any, Any, Any], Launcher] | None = None

    def __post_init__(self) -> None:
        if {"ref", "python"} & set(self.ab_sides) and self.make_on_host is None:
            raise ValueError(f"launcher {self.name!r}: ab_sides {self.ab_sides} start ranks on this host "
                             f"with another folder or interpreter: it needs make_on_host")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to pytest (CI cancellation, ``timeout``, a scheduler): raised by the
    plugin's handler so that it unwinds exactly as Ctrl-C does (plugin.py installs it)."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


def why_stopped(exc: KeyboardInterrupt) -> str:
    """``interrupted by Ctrl-C`` or ``stopped by SIGTERM``: how a case was stopped, in words."""
    return f"stopped by {exc.signal_name}" if isinstance(exc, Terminated) else "interrupted by Ctrl-C"


class StopSignals:
    """Ctrl-C, SIGTERM and SIGHUP to pytest (plugin.py installs ``handle`` where nobody else handles
    them). The first raises in the main thread (KeyboardInterrupt, or Terminated) and the running
    case's launcher stops its ranks and returns the case's result, which the runner stores. A second
    signal while that case is still being stopped and stored waits for it (a line says so) instead of
    unwinding the stop half-done: two presses 0.05 s apart stored nothing. ``waited`` counts them, for
    the runner to say once the result is stored (a signal handler prints nothing: pytest may be
    capturing). A signal FORCE_AFTER_S into a stop that has not ended unwinds it all the same."""

    FORCE_AFTER_S = 60.0

    def __init__(self) -> None:
        self.case_running = False
        self.stopping_since: float | None = None
        self.waited = 0

    def handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if (self.case_running and self.stopping_since is not None
                and now - self.stopping_since < self.FORCE_AFTER_S):
            self.waited += 1
            return
        self.stopping_since = now
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    @contextlib.contextmanager
    def case(self) -> Iterator[None]:
        """Within: a case runs (or is being stopped and stored), so a second signal waits for it."""
        self.case_running, self.stopping_since, self.waited = True, None, 0
        try:
            yield
        finally:
            self.case_running, self.stopping_since = False, None


STOPS = StopSignals()  # the process's one: signal handlers are process state


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, SIGHUP) during a case: the ranks were stopped; ``result`` records it."""

    def __init__(self, result: BenchResult) -> None:
        super().__init__("interrupted")
        self.result = result


def checked_table(name: str, problem: Callable[[dict], tuple[str, object, str] | None],
                  ) -> Callable[[object, Callable[[str, str], Exception]], dict]:
    """A launcher's parser of its profile table ``[name]``: a table whose first value that breaks
    its rule (``problem`` gives key, value, rule) is ``bad(f"{name}.{key}", ...)``, naming the key."""
    def parse(table, bad):
        if not isinstance(table, dict):
            raise bad(name, "must be a table")
        broken = problem(table)
        if broken:
            key, value, rule = broken
            raise bad(f"{name}.{key}", f"{value!r} {rule}")
        return table

    return parse


def read_log(path: Path) -> str:
    """A log file's text, "" when it is not there (yet) or unreadable."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def torchrun_exit_codes(output: str) -> dict[int, int]:
    """{global rank: exit code} of every failed rank in torchrun's failure listing(s)."""
    return {int(rank): int(code) for rank, code in TORCHRUN_FAILURE.findall(output)}


def death(code: int, oom_evidence: str | None) -> tuple[str, str]:
    """(status, words) for a rank that died without recording a failure, saying only what was
    observed: SIGKILL is ``oom`` only with evidence of the OOM killer (launchers/oom.py)."""
    if code >= 0:
        return "error", f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if code == -signal.SIGKILL:
        if oom_evidence:
            return "oom", f"killed by SIGKILL; {oom_evidence}"
        return "error", f"killed by SIGKILL ({NO_EVIDENCE})"
    return "error", f"killed by {name}"


def attribute_failure(result: BenchResult, torchrun_output: str, root_rank: int | None = None,
                      oom_evidence: str | None = None) -> BenchResult:
    """Blame the rank that recorded its failure first, unless torchrun lists a rank that died
    without recording one (an exit code other than the harness's): that rank took the others
    down, and their recorded errors are only broken connections."""
    died = {rank: code for rank, code in torchrun_exit_codes(torchrun_output).items()
            if code not in (EXIT_RUN_FAILED, STOPPED_BY_TORCHRUN)}
    if not died or result.failed_rank in died:
        return result
    rank = root_rank if root_rank in died else min(died)
    status, how = death(died[rank], oom_evidence)
    return result.replace(failed_rank=rank, status=status,
                          error=f"rank {rank} died ({how}) without recording a failure; then {result.error}")
