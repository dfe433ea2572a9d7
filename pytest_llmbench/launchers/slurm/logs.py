"""What a Slurm case's logs say (launcher.py runs the case): every rank's progress while the job runs
(``Watch``), and its result after (``collect``): result.json, else the checksummed markers in the node
logs, else a failure built from them, marked with the mode and job it ran as (``mark``).
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.result import BenchResult, ResultError
from harness.spec import RunSpec
from harness.transport import extract_marked
from pytest_llmbench.launchers.base import Progress, attribute_failure, tail
from pytest_llmbench.launchers.progress import ProgressFeed
from pytest_llmbench.launchers.slurm.jobs import denied, node_logs, rank_logs

PROGRESS_EVERY_S = 5.0

def collect(spec: RunSpec, run_dir: Path, run_id: str, status: str, reason: str, how: str,
            job: str) -> BenchResult:
    """result.json, else the markers in the node logs, else a failure built from the logs."""
    logs = rank_logs(run_dir)
    nodes = node_logs(run_dir)
    everything = "\n".join(nodes.values())
    log_tail = "\n".join(f"--- rank {r} ---\n{tail(t, 20)}" for r, t in sorted(logs.items())) or \
        "\n".join(f"--- {name} ---\n{tail(t, 20)}" for name, t in sorted(nodes.items()))
    found: list[BenchResult] = []
    try:
        if (run_dir / "result.json").exists():
            found.append(BenchResult.loads((run_dir / "result.json").read_text()))
        found += [r for text in logs.values() if (r := extract_marked(text))]
    except ResultError as exc:
        return mark(BenchResult.failure(spec, status="error", run_id=run_id, log_tail=log_tail,
                                              error=f"result unusable: {exc}"), how, job)
    ok = [r for r in found if r.ok]
    if ok:  # a finished measurement is never thrown away
        return mark(ok[0], how, job)
    if found:
        first = min(found, key=lambda r: r.created_utc)
        cause = attribute_failure(first, everything)
        if status == "timeout" and cause.status != "timeout":
            cause = cause.replace(status="timeout", error=f"{reason}; {cause.error}")
        elif reason and status != "finished":
            cause = cause.replace(error=f"{cause.error} ({reason})")
        rank = cause.failed_rank
        cause = cause.replace(log_tail=tail(logs[rank]) if rank in logs else log_tail)
        return mark(cause, how, job)
    if status == "finished":
        status, reason = "error", "the job completed but no result was written"
    unshared = "the run folder must be on a filesystem" in everything
    if not nodes and job:
        why = denied(run_dir)
        reason += (f"; no node wrote its log into {run_dir}: "
                   + (why or "is the run folder on a filesystem every node shares?"))
    elif unshared:
        reason += "; a node could not read the run folder: it is not on a filesystem the nodes share"
    return mark(BenchResult.failure(spec, status=status, run_id=run_id, error=reason,
                                          log_tail=log_tail), how, job)

def mark(result: BenchResult, how: str, job: str) -> BenchResult:
    """Say where the case ran: the mode and the job (the result's env, as the report reads it)."""
    return result.replace(env={**result.env, "slurm": {"mode": how, "job": job}})


class Watch:
    """Every rank's last step from the node logs; rank 0's progress line."""

    def __init__(self, run_dir: Path, world_size: int, progress: Progress) -> None:
        self.run_dir, self.world_size = run_dir, world_size
        self.feed, self.last_poll = ProgressFeed(progress), 0.0

    def poll(self) -> None:
        if time.monotonic() - self.last_poll < PROGRESS_EVERY_S:
            return
        self.last_poll = time.monotonic()
        self.feed.take(rank_logs(self.run_dir))

    def summary(self) -> str:
        self.last_poll = 0.0
        self.poll()
        return self.feed.ranks.summary(range(self.world_size), time.monotonic())
