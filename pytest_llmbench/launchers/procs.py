"""The processes of one case, found by a mark in their environment, and ended for good.

torchrun starts every rank in a session of its own, so ending torchrun's process group
misses the ranks, and a rank that is stopped (SIGSTOP) or stuck ignores SIGTERM. Every
process a case starts inherits ``LLMBENCH_RUN_ID=<mark>`` (ranks, their workers, compiler
subprocesses), and the kernel keeps that in ``/proc/<pid>/environ`` whoever the parent is now.
The mark is the run id and a token of that launch (``case_mark``), so two launches that share
a run id (two direct callers choosing one) never end each other's processes; the local and the
Slurm launcher both mark so. After torchrun has gone, whatever still carries the mark is a
leftover: it is killed with SIGKILL (which also ends a stopped process) and waited for. Linux
only; elsewhere the harness's parent-death signal is the only guard.

Also: a live snapshot of each rank (state, CPU time) for saying which ranks were still working
when a case timed out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
RUN_MARK = "LLMBENCH_RUN_ID"  # the environment variable every process of a case carries


def case_mark(run_id: str) -> str:
    """The mark of one launch's processes: its run id, and a token of this launch and no other's."""
    return f"{run_id}.{secrets.token_hex(4)}"

STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped by a signal",
          "t": "stopped by a debugger", "Z": "exited (zombie)"}


@dataclass(frozen=True)
class Process:
    pid: int
    state: str  # one letter, /proc/<pid>/stat
    cpu_s: float  # user + system CPU time so far
    env: dict[str, str]
    cmdline: str

    @property
    def rank(self) -> int | None:
        value = self.env.get("RANK", "")
        return int(value) if value.isdigit() else None


def find(name: str, value: str) -> list[Process]:
    """Live processes (not zombies) whose environment has ``name=value``; never this one."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in _pids():
        if entry == os.getpid():
            continue
        try:
            raw = (PROC / str(entry) / "environ").read_bytes()
            if needle not in raw.split(b"\0"):
                continue
            process = _read(entry, raw)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        if process.state != "Z":
            found.append(process)
    return found


def end_all(name: str, value: str, *, wait_s: float = 5.0) -> list[Process]:
    """SIGKILL every live process marked ``name=value`` and wait until none is left; returns
    those that had to be killed."""
    leftovers = find(name, value)
    for process in leftovers:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    while leftovers and find(name, value) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leftovers


def stop_group(proc: subprocess.Popen, name: str, value: str, *, grace_s: float) -> None:
    """End ``proc`` (torchrun) and everything carrying ``name=value``: resume a stopped process of the
    mark so that it can hear SIGTERM, SIGTERM ``proc``'s process group (torchrun passes it on to
    its ranks), SIGKILL it after ``grace_s``, then kill whatever of the mark is left (ranks live in
    sessions of their own). A ``proc`` that has exited is not signalled (its pid may be reused)."""
    for process in find(name, value):
        if process.state in ("T", "t"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGCONT)
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    end_all(name, value)


def describe(process: Process) -> str:
    return f"pid {process.pid} ({STATES.get(process.state, process.state)}): {process.cmdline[:120]}"


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _read(pid: int, environ: bytes) -> Process:
    stat = (PROC / str(pid) / "stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    ticks = os.sysconf("SC_CLK_TCK")
    env = dict(item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item)
    cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return Process(pid=pid, state=fields[0], cpu_s=(int(fields[11]) + int(fields[12])) / ticks,
                   env=env, cmdline=cmdline.strip())
