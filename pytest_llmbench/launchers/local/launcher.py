"""Local launcher: torchrun on this host, one process per rank.

    run_dir/spec.json        the case
    run_dir/result.json      written by rank 0 (or by the first rank that failed)
    run_dir/torchrun.log     torchrun's own output
    run_dir/logs/.../<rank>/{stdout,stderr}.log   every rank's output (torchrun --log-dir)

``--standalone`` picks a free rendezvous port, so two suites can run at once. Every process
of the case carries ``LLMBENCH_RUN_ID`` in its environment; whatever still carries it once
torchrun has gone (a rank stopped with SIGSTOP, a worker a rank started) is killed before
``run`` returns, on every path: success, failure, timeout, Ctrl-C (launchers/procs.py).
"""

from __future__ import annotations

import atexit
import os
import shlex
import subprocess
import time
from pathlib import Path

from harness.derive_after import with_wall_time
from harness.result import REJECTED, BenchResult, ResultError
from harness.spec import RunSpec
from harness.transport import write_atomic
from pytest_llmbench.launchers import oom, procs
from pytest_llmbench.launchers.base import (
    TORCHRUN_FAILURE,
    Interrupted,
    LauncherKind,
    Progress,
    attribute_failure,
    death,
    host_env,
    read_log,
    tail,
    why_stopped,
)
from pytest_llmbench.launchers.local import warm
from pytest_llmbench.launchers.procs import RUN_MARK
from pytest_llmbench.launchers.progress import ProgressFeed
from pytest_llmbench.options import Option, text

PROGRESS_EVERY_S = 2.0
KILL_GRACE_S = 10.0


class LocalLauncher:
    """torchrun on this host, one process per rank; one case spans one node. With ``pools`` a
    case runs on warm ranks (launchers/local/warm.py) that served earlier cases; without, or for a case
    a pool cannot serve, one torchrun for this case alone."""

    def __init__(self, progress_every_s: float = PROGRESS_EVERY_S, pools: warm.Pools | None = None,
                 host: warm.Host | None = None) -> None:
        self.progress_every_s = progress_every_s
        self.pools = pools
        self.host = host or warm.Host()  # the interpreter and folder the ranks start with (A/B sides)

    @classmethod
    def from_settings(cls, settings, profile, host: warm.Host | None = None) -> LocalLauncher:
        """``host``: an A/B baseline side's interpreter, folder and environment (pytest_llmbench/ab.py)."""
        return cls(pools=None if getattr(settings, "fresh", False) else session_pools(), host=host)

    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress) -> BenchResult:
        run_dir = Path(run_dir).resolve()  # ranks of an A/B side start in another folder (warm.Host)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "spec.json", spec.dumps())
        if self.pools is not None and warm.can_serve(spec) is None:
            return self._warm(spec, run_dir=run_dir, run_id=run_id, timeout_s=timeout_s, env=env,
                              progress=progress)
        return self._fresh(spec, run_dir=run_dir, run_id=run_id, timeout_s=timeout_s, env=env,
                           progress=progress)

    def _command(self, spec: RunSpec, run_dir: Path, run_id: str) -> list[str]:
        return [self.host.python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={spec.nproc_per_node}", f"--log-dir={run_dir / 'logs'}",
                "--redirects=3", "-m", "harness", f"--spec={run_dir / 'spec.json'}",
                f"--out={run_dir / 'result.json'}", f"--run-id={run_id}"]

    def preview(self, spec: RunSpec, *, run_id: str, timeout_s: float, env: dict[str, str],
                run_dir: Path) -> dict[str, str]:
        """What ``run`` would start (``--llmbench-dry-run``): torchrun with the case's environment
        (the profile's [env], which this shell's exported values override). Warm ranks, when they
        serve a case, run the same harness on ranks already started."""
        added = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if k not in os.environ)
        return {"torchrun.sh": f"#!/bin/sh\n# timeout {timeout_s:g} s\nenv {added} \\\n  "
                               f"{shlex.join(self._command(spec, run_dir, run_id))}\n"}

    def _fresh(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
               env: dict[str, str], progress: Progress) -> BenchResult:
        cmd = self._command(spec, run_dir, run_id)
        started, oom_before = time.monotonic(), oom.read_counts()
        mark = procs.case_mark(run_id)  # this launch's processes, and no other's
        watch = _Watch(run_dir, mark, spec.world_size, progress, self.progress_every_s)
        fresh = {"mode": "fresh", "mark": mark}  # the LLMBENCH_RUN_ID its processes carried
        with open(run_dir / "torchrun.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**host_env(env), **dict(self.host.env), RUN_MARK: mark},
                                    cwd=self.host.cwd)
            try:
                status, reason = watch.wait(proc, timeout_s)
            except KeyboardInterrupt as exc:
                procs.stop_group(proc, RUN_MARK, mark, grace_s=KILL_GRACE_S)
                result = _collect(spec, run_dir, run_id, rc=proc.returncode, status="error",
                                  reason=f"{why_stopped(exc)}; ranks stopped")
                raise Interrupted(with_wall_time(result.replace(launch=fresh),
                                                 time.monotonic() - started)) from None
        leftovers = procs.end_all(RUN_MARK, mark)
        if leftovers:
            progress(f"killed {len(leftovers)} process(es) of this case still running after torchrun "
                     f"exited: {'; '.join(procs.describe(p) for p in leftovers)}")
        result = _collect(spec, run_dir, run_id, rc=proc.returncode, status=status, reason=reason,
                          oom_evidence=oom.evidence(oom_before, oom.read_counts()))
        return with_wall_time(result.replace(launch=fresh), time.monotonic() - started)

    def _warm(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
              env: dict[str, str], progress: Progress) -> BenchResult:
        """The case on a pool's warm ranks; read back exactly as a fresh run's files are."""
        started, oom_before = time.monotonic(), oom.read_counts()
        try:
            pool = self.pools.get(spec, env, timeout_s=timeout_s, progress=progress, host=self.host)
        except warm.PoolError as exc:
            result = BenchResult.failure(spec, status="error", run_id=run_id, error=str(exc),
                                         log_tail=exc.log_tail, launch={"mode": "warm"})
            return with_wall_time(result, time.monotonic() - started)
        except KeyboardInterrupt as exc:  # while the pool's ranks started: WarmPool.start stopped them
            result = BenchResult.failure(spec, status="error", run_id=run_id,
                                         error=f"{why_stopped(exc)} while its warm ranks were starting; "
                                               f"ranks stopped",
                                         log_tail=getattr(exc, "log_tail", ""), launch={"mode": "warm"})
            raise Interrupted(with_wall_time(result, time.monotonic() - started)) from None
        watch = _Watch(run_dir, pool.mark, spec.world_size, progress, self.progress_every_s)
        since = pool.log_size()
        job = {"spec": str(run_dir / "spec.json"), "out": str(run_dir / "result.json"), "run_id": run_id,
               "logs": str(run_dir / "logs" / pool.mark / "attempt_0")}
        try:  # the whole timeout for the case itself: a pool's start-up had its own
            outcome = pool.run(job, timeout_s=timeout_s, poll=watch.poll, doing=watch.doing,
                               every_s=self.progress_every_s)
        except KeyboardInterrupt as exc:
            pool.broken = True
            self._retire(pool, run_dir, since, why_stopped(exc), progress)
            result = _collect(spec, run_dir, run_id, rc=None, status="error",
                              reason=f"{why_stopped(exc)}; ranks stopped")
            raise Interrupted(with_wall_time(result.replace(launch=pool.describe(pool.cases - 1)),
                                             time.monotonic() - started)) from None
        if pool.retire_reason:
            self._retire(pool, run_dir, since, pool.retire_reason, progress)
        result = _collect(spec, run_dir, run_id, rc=outcome.rc, status=outcome.status, reason=outcome.reason,
                          oom_evidence=oom.evidence(oom_before, oom.read_counts()))
        return with_wall_time(result.replace(launch=pool.describe(outcome.index)), time.monotonic() - started)

    def _retire(self, pool: warm.WarmPool, run_dir: Path, since: int, reason: str,
                progress: Progress) -> None:
        """Retire the pool, keeping torchrun's output of this case in the case's torchrun.log
        (where a failed rank's exit code is read, as for a fresh run)."""
        if pool.broken and pool.proc.poll() is None:
            pool.kill_ranks()
        (run_dir / "torchrun.log").write_text(pool.log_since(since))
        self.pools.retire(pool, reason)
        progress(f"warm ranks {pool.mark} retired after {pool.cases} case(s): {pool.retire_reason or reason}")


class _Watch:
    """Waits for torchrun, reports rank 0's progress and keeps every rank's last step."""

    def __init__(self, run_dir: Path, mark: str, world_size: int, progress: Progress,
                 every_s: float) -> None:
        self.run_dir, self.mark, self.world_size = run_dir, mark, world_size
        self.every_s = every_s
        self.feed = ProgressFeed(progress)

    def wait(self, proc: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
        """("finished", "") the moment torchrun exits, or ("timeout", what the ranks were doing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                doing = self.doing()
                procs.stop_group(proc, RUN_MARK, self.mark, grace_s=KILL_GRACE_S)
                return "timeout", (f"no result after {timeout_s:g} s; {doing}; "
                                   "every process of the case killed")
            try:
                proc.wait(timeout=min(remaining, self.every_s))
                return "finished", ""
            except subprocess.TimeoutExpired:
                self.poll()

    def doing(self) -> str:
        """What each rank was last seen doing, with its process state (for a timeout's reason)."""
        return self.feed.ranks.summary(range(self.world_size), time.monotonic(), _rank_facts(self.mark))

    def poll(self) -> None:
        stdout = {int(path.parent.name): _read_tail(path)
                  for path in (self.run_dir / "logs").glob("*/attempt_*/*/stdout.log")
                  if path.parent.name.isdigit()}
        self.feed.take(stdout)


def _rank_facts(mark: str, sample_s: float = 0.5) -> dict[int, str]:
    """{rank: its process state and CPU use over ``sample_s``}, read from /proc."""
    def ranks() -> dict[int, procs.Process]:
        return {p.rank: p for p in procs.find(RUN_MARK, mark)
                if p.rank is not None and "-m harness" in p.cmdline}

    before = ranks()
    time.sleep(sample_s)
    facts = {}
    for rank, now in ranks().items():
        used = now.cpu_s - before[rank].cpu_s if rank in before else 0.0
        facts[rank] = f"process {procs.STATES.get(now.state, now.state)}, {used:.2f} CPU s in {sample_s:g} s"
    return facts


def _collect(spec: RunSpec, run_dir: Path, run_id: str, *, rc: int | None, status: str,
             reason: str, oom_evidence: str | None = None) -> BenchResult:
    """The case's BenchResult from result.json, or a failure built from the logs."""
    logs = rank_logs(run_dir)
    out = run_dir / "result.json"
    root = _root_cause(run_dir)
    if status == "finished" and out.exists():
        try:
            result = BenchResult.loads(out.read_text())
        except ResultError as exc:
            return BenchResult.failure(spec, status="error", run_id=run_id, log_tail=_tail_all(logs),
                                       error=f"result.json unreadable: {exc}")
        if result.ok:
            return result
        result = attribute_failure(result, read_log(run_dir / "torchrun.log"), root[0] if root else None,
                                   oom_evidence)
        rank = result.failed_rank
        return result.replace(log_tail=tail(logs[rank]) if rank in logs else _tail_all(logs))
    if status == "finished":
        rejected = _rejection(logs)
        if rejected:  # every rank refused the spec before starting (exit 2): its own words
            reason = f"the harness rejected the spec: {rejected}"
        elif rc is None:  # a warm pool's ranks reported the case done, and wrote no result
            reason = "the warm ranks finished the case without a result"
        else:
            reason = f"torchrun exited {rc} without a result"
    final = "timeout" if status == "timeout" else "error"
    if root:
        verdict, how = death(root[1], oom_evidence)
        reason += f"; root cause: rank {root[0]} {how}"
        final = final if status == "timeout" else verdict
    text = _tail_all(logs) + "\n--- torchrun ---\n" + tail(read_log(run_dir / "torchrun.log"), 15)
    return BenchResult.failure(spec, status=final, run_id=run_id, error=reason,
                               failed_rank=root[0] if root else None, log_tail=text)


def _rejection(logs: dict[int, str]) -> str | None:
    """The harness's reason for refusing the spec (``llmbench harness: invalid input: ...``, printed by
    harness/__main__.py and harness/pool.py before exit 2), from the first rank that gave one."""
    for _, log in sorted(logs.items()):
        for line in log.splitlines():
            if line.startswith(REJECTED):
                return line.removeprefix(REJECTED).strip()
    return None


def rank_logs(run_dir: Path) -> dict[int, str]:
    """{rank: stdout + stderr} for every rank torchrun started."""
    logs: dict[int, str] = {}
    for folder in sorted((run_dir / "logs").glob("*/attempt_*/*")):
        if folder.name.isdigit():
            logs[int(folder.name)] = read_log(folder / "stdout.log") + read_log(folder / "stderr.log")
    return logs


def _root_cause(run_dir: Path) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)", if any."""
    block = read_log(run_dir / "torchrun.log").partition("Root Cause (first observed failure)")[2]
    found = TORCHRUN_FAILURE.search(block)
    return (int(found[1]), int(found[2])) if found else None


def _tail_all(logs: dict[int, str]) -> str:
    return "\n".join(f"--- rank {rank} ---\n{tail(text, 20)}" for rank, text in sorted(logs.items()))


def _read_tail(path: Path, size: int = 4096) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


_POOLS: warm.Pools | None = None  # made at the first case that needs warm ranks, not at import


def session_pools() -> warm.Pools:
    """This process's warm ranks: made when a case first needs them, ended with the session
    (KIND.finish) or, failing that, at exit. Importing this module starts and registers nothing (a
    report build imports every launcher)."""
    global _POOLS
    if _POOLS is None:
        _POOLS = warm.Pools()
        atexit.register(_POOLS.close_all)
    return _POOLS


def _finish() -> None:
    if _POOLS is not None:
        _POOLS.close_all()


KIND = LauncherKind(
    name="local", doc="torchrun on this host, one process per rank",
    make=LocalLauncher.from_settings, host_lock=True, on_this_host=True, finish=_finish,
    ab_sides=("ref", "python", "env"), make_on_host=LocalLauncher.from_settings,
    options=(Option("fresh", "one torchrun per case: every case starts its ranks cold (imports, process "
                    "group) instead of on warm ranks that served earlier cases of the same world size "
                    "and environment.", text, flag=True),))
