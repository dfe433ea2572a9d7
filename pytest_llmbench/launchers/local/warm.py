"""Warm ranks: one torchrun per (world size, backend, environment), serving case after case.

A fresh case pays torchrun, the imports of torch, DeepSpeed and transformers, and the process
group on every launch (5-8 s a case on 2 cores, more than its measured steps). A pool pays them
once: its ranks (harness/pool.py) import everything, join the process group, then wait on a
named pipe for the next case, run it with the same code as a fresh rank and clean up after it.

    Pools.get(spec, env)  the pool for this world size, backend and environment (started if
                          needed; the least recently used one retired beyond MAX_POOLS)
    WarmPool.run(...)     send the case, wait for every rank's "done", a timeout or the
                          pool's end; the launcher then reads the case's files as for a fresh run

A pool is retired (its torchrun stopped, every process carrying its mark killed) after
MAX_CASES cases, on any failed case, timeout or Ctrl-C, and when a rank's resident (or device)
memory after clean-up grows more than GROWTH_GIB beyond what it held after its first case. An
idle rank blocks on its pipe: no CPU while another pool's case is measured. Pools end with the
pytest session (LauncherKind.finish), or when the launcher's process dies (their pipes close).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.spec import RunSpec
from pytest_llmbench.launchers import procs
from pytest_llmbench.launchers.base import Progress, host_env, read_log, tail

MAX_CASES = 32  # then a new pool: bounds what a slow leak can do
MAX_POOLS = 2  # alive at once: a baseline world size and a scaled one alternate in trials
GROWTH_GIB = 0.25  # a rank holding this much more after clean-up than after its first case is leaking
STOP_GRACE_S = 10.0
# A pool's start-up (torchrun, imports of torch, DeepSpeed, transformers, peft, rendezvous) gets at
# least this long, whatever the case's timeout: it is paid once for many cases, took 7.5-8.2 s here
# alone and over 25 s with two test files running at once (a 25 s case timeout then failed the
# case as "did not start" before it ran).
START_MIN_S = 120.0
# One pool at a time on the GPUs: each idle rank keeps a CUDA context (~0.5 GiB), the NCCL
# communicator and DeepSpeed's group clone on GPUs 0..k-1, so a second pool's ranks would share
# GPU 0 with them (less free memory than the other GPUs; GPUs in EXCLUSIVE_PROCESS compute mode
# refuse the second context outright). CPU pools (gloo) share cores, not GPUs: two may stay.
ONE_GPU_POOL = "another pool needs the GPUs (one pool's ranks at a time hold CUDA contexts on them)"
# environment variables that change from test to test without changing what a rank does
VOLATILE_ENV = ("PYTEST_CURRENT_TEST",)


class PoolError(RuntimeError):
    """A pool that could not start; ``log_tail`` says why."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class Outcome:
    """How a case sent to a pool ended: "finished" (every rank done, or the pool ended) or
    "timeout"; ``rc`` is torchrun's exit code when the pool ended with the case."""

    status: str
    reason: str = ""
    rc: int | None = None
    index: int = 0


@dataclass(frozen=True)
class Host:
    """How ranks start on this host: the interpreter, and the folder they start in (``python -m harness``
    imports the harness of that folder first: an A/B session's baseline side is a git worktree,
    pytest_llmbench/ab.py). The default: this interpreter, this folder."""

    python: str = sys.executable
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # over this process's own: an A/B side's env=FILE beats the shell


@dataclass
class WarmPool:
    key: tuple
    nproc: int
    backend: str
    env: dict[str, str]
    mark: str  # every process of the pool carries LLMBENCH_RUN_ID=<mark>
    host: Host = field(default_factory=Host)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llmbench-pool-")))
    cases: int = 0
    start_s: float | None = None
    first_after: dict[int, float] = field(default_factory=dict)  # rank -> GiB held after case 0
    held: dict[int, float] = field(default_factory=dict)  # rank -> GiB held after the last case's clean-up
    retire_reason: str = ""  # set when the pool must not serve another case
    broken: bool = False  # a rank failed, or a case timed out: killed, not closed

    def start(self, timeout_s: float, progress: Progress) -> None:
        """Start torchrun with the pool's ranks and wait until every rank is ready."""
        self.jobs, self.done = {}, None
        for rank in range(self.nproc):  # read-write ends never block and never see EOF while held
            os.mkfifo(self.folder / f"jobs.{rank}")
            self.jobs[rank] = os.open(self.folder / f"jobs.{rank}", os.O_RDWR)
        os.mkfifo(self.folder / "done")
        self.done = os.open(self.folder / "done", os.O_RDWR | os.O_NONBLOCK)
        self.buffer = b""
        cmd = [self.host.python, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={self.nproc}", f"--log-dir={self.folder / 'logs'}", "--redirects=3",
               "-m", "harness.pool", f"--dir={self.folder}", f"--backend={self.backend}"]
        started = time.monotonic()
        self.log = open(self.folder / "torchrun.log", "w")  # noqa: SIM115 - lives as long as the pool
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**host_env(self.env), **dict(self.host.env),
                                          "LLMBENCH_RUN_ID": self.mark},
                                     cwd=self.host.cwd)
        progress(f"starting warm ranks {self.mark} (ws{self.nproc}, {self.backend})")
        ready: set[int] = set()
        deadline = started + timeout_s
        try:
            while len(ready) < self.nproc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    why = (f"torchrun exited {self.proc.returncode}" if self.proc.returncode is not None
                           else f"not ready after {timeout_s:g} s")
                    text = self.log_tail()
                    self.kill()
                    raise PoolError(f"warm ranks {self.mark} did not start: {why}", text)
                ready |= {event["rank"] for event in self._events(0.2) if event["event"] == "ready"}
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while the ranks start: none outlives it
            exc.log_tail = self.log_tail()  # the launcher records it (LocalLauncher._warm)
            self.kill()
            raise
        self.start_s = time.monotonic() - started

    def run(self, job: dict, *, timeout_s: float, poll: Callable[[], None],
            doing: Callable[[], str], every_s: float) -> Outcome:
        """Send one case to every rank and wait for all of them to finish it."""
        index = self.cases
        self.cases += 1
        line = (json.dumps({**job, "index": index}) + "\n").encode()
        for fd in self.jobs.values():
            os.write(fd, line)
        done: dict[int, dict] = {}
        deadline, last_poll = time.monotonic() + timeout_s, time.monotonic()
        while len(done) < self.nproc:
            if self.proc.poll() is not None:
                self.retire_reason, self.broken = "a rank failed: torchrun ended the pool", True
                return Outcome("finished", rc=self.proc.returncode, index=index)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.retire_reason, self.broken = "the case timed out", True
                return Outcome("timeout", f"no result after {timeout_s:g} s; {doing()}; "
                                          f"every process of the warm ranks killed", index=index)
            for event in self._events(min(remaining, every_s, 0.5)):
                if event["event"] == "done" and event["index"] == index:
                    done[event["rank"]] = event
            if time.monotonic() - last_poll >= every_s:
                poll()
                last_poll = time.monotonic()
        self._after_case(done)
        return Outcome("finished", index=index)

    def _after_case(self, done: dict[int, dict]) -> None:
        if any(event["rc"] != 0 for event in done.values()):
            self.retire_reason, self.broken = "a rank failed", True
            return
        for rank, event in done.items():
            held = event.get("device_allocated_gib")
            held = event.get("rss_gib") if held is None else held
            if held is None:
                continue
            self.held[rank] = held
            first = self.first_after.setdefault(rank, held)
            if held - first > GROWTH_GIB:
                self.retire_reason = (f"rank {rank} holds {held:.2f} GiB after clean-up, {held - first:.2f} "
                                      f"GiB more than after its first case")
        if self.cases >= MAX_CASES:
            self.retire_reason = f"served {self.cases} cases"

    def describe(self, index: int) -> dict:
        """What a result records of how its ranks were launched."""
        return {"mode": "warm", "pool": self.mark, "case_index": index,
                "pool_start_s": round(self.start_s or 0.0, 3),
                "allocator": "glibc mmap threshold fixed at 32 MiB",
                "held_after_gib": {str(rank): round(gib, 4) for rank, gib in sorted(self.held.items())}}

    def _events(self, wait_s: float) -> list[dict]:
        readable, _, _ = select.select([self.done], [], [], wait_s)
        if readable:
            with contextlib.suppress(BlockingIOError):
                self.buffer += os.read(self.done, 65536)
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def log_tail(self) -> str:
        """The end of torchrun's own output and of every rank's pool-level log."""
        text = read_log(self.folder / "torchrun.log")
        ranks = sorted((self.folder / "logs").glob("*/attempt_*/*/std*.log"))
        return "\n".join([tail(text, 15)] + [f"--- {path.parent.name} {path.name} ---\n"
                                             f"{tail(read_log(path), 10)}" for path in ranks])

    def log_size(self) -> int:
        """torchrun's output so far, in bytes (where a case's share of it starts)."""
        try:
            return (self.folder / "torchrun.log").stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """torchrun's output from byte ``offset`` on."""
        try:
            with open(self.folder / "torchrun.log", "rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Let the ranks finish (their job pipes close), then make sure nothing of the pool is left."""
        for fd in self.jobs.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.jobs = {}
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def gone(self) -> str | None:
        """Why this idle pool can no longer serve a case (torchrun or a rank has exited), or None."""
        if getattr(self, "proc", None) is None:  # not started
            return None
        if self.proc.poll() is not None:
            return f"torchrun exited {self.proc.returncode} while its ranks were idle"
        ranks = {p.rank for p in procs.find("LLMBENCH_RUN_ID", self.mark) if "harness.pool" in p.cmdline}
        missing = sorted(set(range(self.nproc)) - ranks)
        if missing:
            return f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} exited while idle"
        return None

    def kill(self) -> None:
        """Stop every process of the pool (kill_ranks); its pipes and folder go."""
        self.kill_ranks()
        for fd in [*self.jobs.values(), self.done]:
            with contextlib.suppress(OSError, TypeError):
                os.close(fd)
        self.jobs, self.done = {}, None
        with contextlib.suppress(OSError):
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def kill_ranks(self) -> None:
        """End torchrun and every process still carrying the pool's mark (procs.stop_group)."""
        procs.stop_group(self.proc, "LLMBENCH_RUN_ID", self.mark, grace_s=STOP_GRACE_S)


class Pools:
    """The warm pools of this process (one pytest session, or one xdist worker)."""

    def __init__(self) -> None:
        self.alive: dict[tuple, WarmPool] = {}
        self.started = 0

    @staticmethod
    def key(spec: RunSpec, env: dict[str, str], host: Host | None = None) -> tuple:
        """What a pool is for: ranks per node, backend, the ranks' whole environment (the profile's
        [env], allocator and NCCL settings, an injected fault: any change is a new pool) and how they
        start (interpreter and folder: each side of an A/B session has its own pool)."""
        whole = host_env(env)
        kept = tuple(sorted((k, v) for k, v in whole.items() if k not in VOLATILE_ENV))
        return spec.nproc_per_node, backend(spec), kept, host or Host()

    def get(self, spec: RunSpec, env: dict[str, str], *, timeout_s: float, progress: Progress,
            host: Host | None = None) -> WarmPool:
        key = self.key(spec, env, host)
        pool = self.alive.pop(key, None)
        gone = pool.gone() if pool is not None else None
        if gone:  # a rank killed while idle (the OOM killer, a user): never handed a case
            progress(f"warm ranks {pool.mark} retired: {gone}; starting new ones")
            pool.broken = True
            self.retire(pool, gone)
            pool = None
        if pool is None:
            while len(self.alive) >= MAX_POOLS:  # the least recently used goes
                self.retire(self.alive[next(iter(self.alive))], "another pool is needed")
            if backend(spec) == "nccl":
                for other in [p for p in self.alive.values() if p.backend == "nccl"]:
                    self.retire(other, ONE_GPU_POOL)
            self.started += 1
            mark = f"pool-{os.getpid()}-{self.started}"
            pool = WarmPool(key=key, nproc=spec.nproc_per_node, backend=backend(spec), env=dict(env),
                            mark=mark, host=host or Host())
            pool.start(max(timeout_s, START_MIN_S), progress)
        self.alive[key] = pool  # most recently used last
        return pool

    def retire(self, pool: WarmPool, reason: str = "") -> None:
        self.alive = {k: p for k, p in self.alive.items() if p is not pool}
        pool.retire_reason = pool.retire_reason or reason
        if pool.broken:
            pool.kill()
        else:
            pool.close()

    def close_all(self) -> None:
        for pool in list(self.alive.values()):
            self.retire(pool, "the session ended")


def backend(spec: RunSpec) -> str:
    return "nccl" if spec.device == "cuda" else "gloo"


def can_serve(spec: RunSpec) -> str | None:
    """Why this case runs fresh even with warm ranks on, or None when a pool can serve it."""
    if spec.nnodes > 1:
        return "it spans nodes"
    if spec.device == "cuda" and "offload" in spec.variant_parts():
        return "offload needs a CPU collective beside NCCL: its own process group (harness/train.py)"
    return None
