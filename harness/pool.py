"""``python -m harness.pool --dir POOL``: warm ranks, one process per rank (torchrun), that run
case after case in the same process and process group (pytest_llmbench/launchers/local/warm.py
drives them).

    start: import torch once; join the process group once
    -> tell the launcher "ready" -> for each job the launcher sends:
       output to the case's own log files -> the same code as ``python -m harness``
       (harness/rank.py ``run_case``) -> clean up -> tell the launcher "done"

Each case builds its own model, optimizer and engine; the engine is torn down inside the case
(DeepSpeed's ``destroy``). glibc's mmap threshold is fixed (``fix_mmap_threshold``). Between
cases every rank collects garbage, resets torch's compiler
caches, empties the device cache, hands freed heap back to the OS (``malloc_trim``), restores
torch's global flags and puts the default generator back to its start-up seed, so a case finds
what a fresh process would. The peak-memory counters are reset at each case's first step, as in
a fresh run (harness/train.py).

Channels (named pipes the launcher creates and keeps open): ``jobs.<rank>``, one JSON line per
case; ``done``, one JSON line per rank and event. A rank whose case failed exits with the
case's exit code (torchrun then ends the pool, and the launcher records the case as a fresh
run's failure); a rank whose job pipe closes (the launcher is gone) exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import importlib
import json
import os
import sys
import time
from pathlib import Path

from harness.rank import die_with_parent, env_int, run_case
from harness.result import EXIT_BAD_INPUT, EXIT_OK, REJECTED
from harness.spec import SpecError
from harness.spec_file import load_spec


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m harness.pool", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, help="the pool's folder: its job and done pipes")
    parser.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    args = parser.parse_args(argv)
    rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
    pool = Path(args.dir)
    started = time.perf_counter()
    fix_mmap_threshold()
    preload(args.backend)
    join_group(args.backend, local_rank)
    state = Fresh()
    with open(pool / "done", "w", buffering=1) as done, open(pool / f"jobs.{rank}") as jobs:
        tell(done, event="ready", rank=rank, start_s=time.perf_counter() - started, rss_gib=rss_gib())
        for line in jobs:  # blocks until the launcher sends a case; EOF when it has gone
            job = json.loads(line)
            code = serve(job, rank=rank, local_rank=local_rank)
            state.restore()
            tell(done, event="done", rank=rank, index=job["index"], rc=code, rss_gib=rss_gib(),
                 device_allocated_gib=device_allocated_gib())
            if code != EXIT_OK:
                return code  # torchrun ends the pool; the launcher records the case
    return EXIT_OK


def preload(backend: str) -> None:
    """Only what every case needs: torch (join_group) and the harness's training loop. A library
    one kind of case needs (DeepSpeed, transformers, peft, bitsandbytes: ~14 s of imports per rank on
    a 2-core machine, 7 s of it peft's) is imported by the first case that needs it, as a fresh rank
    imports it, and later cases of the pool find it loaded. Importing them changes none of the
    state ``Fresh`` restores (checked by tests/harness/test_warm.py)."""
    if backend == "gloo":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # as harness/parallel/deepspeed.py sets it
    importlib.import_module("harness.train")


def join_group(backend: str, local_rank: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timedelta(minutes=10))


def serve(job: dict, *, rank: int, local_rank: int) -> int:
    """Run one case with this rank's output in the case's own log files; its exit code."""
    logs = Path(job["logs"]) / str(rank)
    logs.mkdir(parents=True, exist_ok=True)
    with redirected(logs):
        try:
            spec = load_spec(job["spec"])
        except SpecError as exc:
            print(f"{REJECTED} {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return run_case(spec, rank=rank, local_rank=local_rank, out=job["out"], run_id=job["run_id"],
                    keep_group=True)


class redirected:
    """Point this process's stdout and stderr (the file descriptors, so C++ and DeepSpeed's
    loggers too) at ``folder/stdout.log`` and ``folder/stderr.log`` for one case."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
            target = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)

    def __exit__(self, *exc) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)


class Fresh:
    """Torch's global state as this process started; ``restore()`` puts it back after a case."""

    def __init__(self) -> None:
        import torch

        self.seed = torch.initial_seed()
        self.threads = torch.get_num_threads()
        self.grad = torch.is_grad_enabled()
        self.dtype = torch.get_default_dtype()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
                      torch.backends.cudnn.allow_tf32)
        self.cuda_tf32 = torch.backends.cuda.matmul.allow_tf32

    def restore(self) -> None:
        import torch

        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        forget_deepspeed_state()
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        trim_heap()
        torch.manual_seed(self.seed)
        torch.set_num_threads(self.threads)
        torch.set_grad_enabled(self.grad)
        torch.set_default_dtype(self.dtype)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.set_float32_matmul_precision(self.matmul_precision)
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
         torch.backends.cudnn.allow_tf32) = self.cudnn
        torch.backends.cuda.matmul.allow_tf32 = self.cuda_tf32


def forget_deepspeed_state() -> None:
    """Drop what DeepSpeed keeps at module level after its engine is destroyed (0.19): ZeRO-3's
    forward-module stack and the ``functools.lru_cache`` of its parameter coordinator's
    ``__params_to_release``, whose keys hold the coordinator, and through it the model and
    optimizer (26 MB per tiny ZeRO-3 case, found with gc.get_referrers). Every lru_cache of a
    DeepSpeed module is emptied (a cache only costs a recomputation)."""
    if "deepspeed" not in sys.modules:
        return
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    if offload is not None:
        offload.FWD_MODULE_STACK.clear()
    for obj in gc.get_objects():
        if isinstance(obj, functools._lru_cache_wrapper) and getattr(obj, "__module__", "").startswith(
                "deepspeed"):
            obj.cache_clear()


MMAP_THRESHOLD = 32 * 1024**2  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def fix_mmap_threshold() -> None:
    """glibc raises its mmap threshold each time a large block is freed, up to 32 MiB, so how a
    case's tensors are allocated depended on the cases before it: a tiny DDP case peaked 3.6%
    higher after a ZeRO-3 case (2 cores). Fixed where a busy process's threshold ends up, the
    allocation no longer depends on history (within 2.1% after ZeRO-3, ZeRO-2 and FSDP cases), and
    steps run as fast as a fresh rank's (benchmarks/warm_ranks.py). Fixed at glibc's initial 128 KiB
    instead, every mid-size tensor went through mmap and page faults: tokens/s 0.67-0.74x fresh."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def trim_heap() -> None:
    """glibc: give the heap's free pages back to the OS, so that the next case's peak resident
    memory (VmHWM, reset at its first step) starts from what it holds, not from the last case's."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the pool's memory-growth check still retires a pool that grows


def rss_gib() -> float | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


def device_allocated_gib() -> float | None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_allocated() / 1024**3
    return None


def tell(done, **event) -> None:
    done.write(json.dumps(event) + "\n")  # one line, under PIPE_BUF: ranks' lines never interleave


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as harness/__main__.py: skip the interpreter's teardown of torch and DeepSpeed
