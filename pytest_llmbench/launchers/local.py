"""Local launcher: torchrun on this host, one process per rank.

    run_dir/spec.json        the case
    run_dir/result.json      written by rank 0 (or by the first rank that failed)
    run_dir/torchrun.log     torchrun's own output
    run_dir/logs/.../<rank>/{stdout,stderr}.log   every rank's output (torchrun --log-dir)

``--standalone`` picks a free rendezvous port, so two suites can run at once. The
whole process group is ended on timeout or Ctrl-C; either way the case is a result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.result import EXIT_BAD_INPUT, BenchResult, ResultError, with_wall_time, write_atomic
from harness.spec import RunSpec
from pytest_llmbench.launchers.base import TORCHRUN_FAILURE, Interrupted, Progress, attribute_failure, tail

PROGRESS_EVERY_S = 2.0
KILL_GRACE_S = 10.0


class LocalLauncher:
    def __init__(self, progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self.progress_every_s = progress_every_s

    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress, placement: dict | None = None,
            placement_source: str = "profile") -> BenchResult:
        """``placement`` (the profile's [k8s] table) does not apply to local runs."""
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path, out_path = run_dir / "spec.json", run_dir / "result.json"
        write_atomic(spec_path, spec.dumps())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={spec.nproc_per_node}", f"--log-dir={run_dir / 'logs'}",
               "--redirects=3", "-m", "harness", f"--spec={spec_path}", f"--out={out_path}",
               f"--run-id={run_id}"]
        started = time.monotonic()
        with open(run_dir / "torchrun.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **env, "LLMBENCH_RUN_ID": run_id})
            try:
                status = _wait(proc, run_dir, timeout_s, progress, self.progress_every_s)
            except KeyboardInterrupt:
                _kill_group(proc)
                result = _collect(spec, run_dir, run_id, rc=proc.returncode, status="error",
                                  reason="interrupted by Ctrl-C; ranks stopped")
                raise Interrupted(with_wall_time(result, time.monotonic() - started)) from None
        reason = f"no result after {timeout_s:g} s; process group killed" if status == "timeout" else ""
        result = _collect(spec, run_dir, run_id, rc=proc.returncode, status=status, reason=reason)
        return with_wall_time(result, time.monotonic() - started)


def _wait(proc: subprocess.Popen, run_dir: Path, timeout_s: float, progress: Progress,
          every_s: float) -> str:
    """Wait for torchrun to exit (returns the moment it does), reporting progress meanwhile."""
    deadline = time.monotonic() + timeout_s
    last_line = ""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_group(proc)
            return "timeout"
        try:
            proc.wait(timeout=min(remaining, every_s))
            return "finished"
        except subprocess.TimeoutExpired:
            line = _last_progress_line(run_dir)
            if line and line != last_line:
                progress(line)
                last_line = line


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group (torchrun and every rank), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _collect(spec: RunSpec, run_dir: Path, run_id: str, *, rc: int | None, status: str,
             reason: str) -> BenchResult:
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
        result = attribute_failure(result, _read(run_dir / "torchrun.log"), root[0] if root else None)
        rank = result.failed_rank
        return result.replace(log_tail=tail(logs[rank]) if rank in logs else _tail_all(logs))
    if status == "finished":
        reason = f"torchrun exited {rc} without a result"
        if rc == EXIT_BAD_INPUT:
            reason = "the harness rejected the spec (exit 2)"
    if root:
        reason += f"; root cause: rank {root[0]} exit code {root[1]}"
    text = _tail_all(logs) + "\n--- torchrun ---\n" + tail(_read(run_dir / "torchrun.log"), 15)
    final = "timeout" if status == "timeout" else "error"
    if root and root[1] == -9 and status != "timeout":
        final, reason = "oom", reason + " (SIGKILL, as the kernel OOM killer sends)"
    return BenchResult.failure(spec, status=final, run_id=run_id, error=reason,
                               failed_rank=root[0] if root else None, log_tail=text)


def rank_logs(run_dir: Path) -> dict[int, str]:
    """{rank: stdout + stderr} for every rank torchrun started."""
    logs: dict[int, str] = {}
    for folder in sorted((run_dir / "logs").glob("*/attempt_*/*")):
        if folder.name.isdigit():
            logs[int(folder.name)] = _read(folder / "stdout.log") + _read(folder / "stderr.log")
    return logs


def _last_progress_line(run_dir: Path) -> str:
    for path in (run_dir / "logs").glob("*/attempt_*/0/stdout.log"):
        lines = [ln for ln in _read(path).splitlines() if ln.startswith("llmbench ")]
        return lines[-1].removeprefix("llmbench ") if lines else ""
    return ""


def _root_cause(run_dir: Path) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)", if any."""
    block = _read(run_dir / "torchrun.log").partition("Root Cause (first observed failure)")[2]
    found = TORCHRUN_FAILURE.search(block)
    return (int(found[1]), int(found[2])) if found else None


def _tail_all(logs: dict[int, str]) -> str:
    return "\n".join(f"--- rank {rank} ---\n{tail(text, 20)}" for rank, text in sorted(logs.items()))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
