"""One rank's life, shared by ``python -m harness`` (one case per process) and the warm ranks of
``python -m harness.pool`` (case after case): die with torchrun, read the rank from torchrun's
environment, run one case and turn any failure into a recorded result.
"""

from __future__ import annotations

import os
import sys
import traceback

from harness import trainer_status
from harness.result import EXIT_OK, EXIT_RUN_FAILED, BenchResult
from harness.spec import RunSpec, SpecError
from harness.transport import marked, write_atomic


def die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this rank when its parent (torchrun) dies, however it dies.
    torchrun starts each rank in a session of its own, so killing torchrun's process group
    misses the ranks, and a rank that is stopped or stuck ignores torchrun's SIGTERM; without
    this a hung rank outlived its case. Elsewhere a no-op (the launchers also sweep)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(EXIT_RUN_FAILED)
    if "TORCHELASTIC_RUN_ID" in os.environ and not _is_torchrun(parent):
        # torchrun died before this rank got here (while it started Python, under load): the
        # rank was reparented before ``parent`` was read, and no signal would ever come
        os._exit(EXIT_RUN_FAILED)


def _is_torchrun(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return False
    return b"torch.distributed.run" in cmdline or b"torchrun" in cmdline


def run_case(spec: RunSpec, *, rank: int, local_rank: int, out: str, run_id: str,
         keep_group: bool = False) -> int:
    """Run the case on this rank; its exit code. ``keep_group``: a warm rank (harness/pool.py)
    keeps the process group for its next case, unless this one failed."""
    failed = False
    try:
        if spec.benchmark == "collectives":
            from harness import collectives as measure
        else:
            from harness import train as measure
        folder = {"out_dir": os.path.dirname(os.path.abspath(out))} if spec.benchmark != "collectives" else {}
        if rank == 0:
            trainer_status.report(0)
        result = measure.run(spec, rank=rank, local_rank=local_rank, run_id=run_id, **folder)
    except BaseException as exc:  # noqa: BLE001 - every failure must become a result
        failure = BenchResult.failure(
            spec, status=_classify(exc), run_id=run_id, failed_rank=rank,
            error=f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        if write_atomic(out, failure.dumps(), exclusive=True):
            sys.stdout.write(marked(failure))
            sys.stdout.flush()
        print(f"llmbench harness: rank {rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        failed = True
        return EXIT_RUN_FAILED
    finally:
        if failed or not keep_group:
            _destroy_process_group(failed=failed)
    if result is not None:
        write_atomic(out, result.dumps())
        sys.stdout.write(marked(result))
        sys.stdout.flush()
        trainer_status.report(100, result.metrics)
    return EXIT_OK


def _classify(exc: BaseException) -> str:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "oom"
    return "oom" if "out of memory" in str(exc).lower() else "error"


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise SpecError(f"environment {name}={value!r} is not an integer") from None


def _destroy_process_group(*, failed: bool = False) -> None:
    """Leave the process group. After a failure on NCCL, leave it to the exit instead: the peers'
    collectives are still pending, and ``destroy_process_group`` can block on them until the
    10-minute watchdog, so a failed case (an OOM) would be recorded as a timeout. The process
    exits right after (harness/__main__.py, harness/pool.py), which frees the communicators."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if failed and "nccl" in str(dist.get_backend()).lower():
        return
    dist.destroy_process_group()
