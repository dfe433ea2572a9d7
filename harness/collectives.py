"""The collectives probe: nccl-tests' measurement, as a benchmark case (spec.benchmark = "collectives").

For each collective (all_reduce, all_gather, reduce_scatter, broadcast) and each message size
of a x2 sweep from ``comm_min_bytes`` to ``comm_max_bytes``, every rank runs
``comm_warmup_iters`` untimed operations, meets the others at a barrier, then times
``comm_iters`` back-to-back operations between two device synchronisations; the time of one
operation is that loop's time / iters (nccl-tests' shape: https://github.com/NVIDIA/nccl-tests,
src/common.cu), and a size's time is the MAX over ranks. nccl-tests reports the mean over ranks
by default (``-a 1``); the max is its ``-a 3``, kept here because a collective is done when its
slowest rank is, which is what a training step waits for: busbw here is at most what
``all_reduce_perf`` prints for the same run. Then the largest all_reduce runs
``comm_iters`` more times, each synchronised and timed alone: the distribution that goes to
pytest-benchmark as the case's rounds.

The bandwidth formulas and the size sweep are in harness/bandwidth.py (nccl-tests'
doc/PERFORMANCE.md); torch is imported by ``run`` alone.
"""

from __future__ import annotations

import time
from typing import Any

from harness.bandwidth import ELEMENT_BYTES, OPS, algbw_gbps, busbw_gbps, element_count, message_sizes
from harness.derive import max_over_ranks, step_stats
from harness.result import BenchResult
from harness.spec import RunSpec


def sweep(spec: RunSpec) -> list[tuple[str, int]]:
    """(op, size) of every measurement, in order: each op over the sizes, a size whose array rounds
    to one already measured (all_gather and reduce_scatter need n elements: at ws4 8 B and 16 B are
    both 16 B) measured once."""
    keys = []
    for op in OPS:
        seen = set()
        for size in message_sizes(spec.comm_min_bytes, spec.comm_max_bytes):
            count = element_count(op, size, spec.world_size)
            if count not in seen:
                seen.add(count)
                keys.append((op, size))
    return keys


def rows_from_times(spec: RunSpec, times_s: list[float]) -> list[dict[str, Any]]:
    """One row per (op, size) of the sweep from the per-operation times (max over ranks), in order."""
    n, rows = spec.world_size, []
    for (op, size), seconds in zip(sweep(spec), times_s, strict=True):
        actual = element_count(op, size, n) * ELEMENT_BYTES
        algbw, busbw = algbw_gbps(actual, seconds), busbw_gbps(op, actual, seconds, n)
        rows.append({"op": op, "size_bytes": actual, "time_s": seconds, "algbw_gbps": algbw,
                     "busbw_gbps": busbw})
    return rows


def probe_metrics(rows: list[dict[str, Any]], iteration_times_s: list[float]) -> dict[str, Any]:
    """Per op: busbw at the largest size and the time of the smallest (latency); the largest
    all_reduce's per-operation time statistics."""
    metrics: dict[str, Any] = dict(step_stats(iteration_times_s))
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        metrics[f"busbw_gbps_{op}"] = mine[-1]["busbw_gbps"]
        metrics[f"latency_s_{op}"] = mine[0]["time_s"]
    metrics["busbw_size_bytes"] = rows[-1]["size_bytes"]
    metrics["busbw_gbps_min"] = min(metrics[f"busbw_gbps_{op}"] for op in OPS)
    return metrics


def run(spec: RunSpec, *, rank: int, local_rank: int, run_id: str) -> BenchResult | None:
    """Sweep every collective over every size; rank 0 returns the result."""
    import torch.distributed as dist

    from harness.dist import all_gather, setup
    from harness.env import collect_env

    device = setup(spec, local_rank)
    times = [_time_loop(spec, op, size, device) for op, size in sweep(spec)]
    iteration = _time_each(spec, device)
    gathered = all_gather({"times": times, "iteration": iteration})
    result = None
    if rank == 0:
        rows = rows_from_times(spec, max_over_ranks([g["times"] for g in gathered]))
        per_iteration = max_over_ranks([g["iteration"] for g in gathered])
        result = BenchResult(spec=spec, status="ok", run_id=run_id, step_times_s=per_iteration,
                             env=collect_env(device, world_size=spec.world_size, nnodes=spec.nnodes),
                             collectives=rows, metrics=probe_metrics(rows, per_iteration),
                             null_reasons={"*": "a collectives probe trains nothing: no training metrics"},
                             strategy_config={"backend": dist.get_backend(), "dtype": "float32"})
    dist.barrier()
    return result


def _operation(op: str, count: int, n: int, device) -> Any:
    """A no-argument callable running one ``op`` on a buffer of ``count`` elements (whole array)."""
    import torch
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    whole = torch.ones(count, dtype=torch.float32, device=device)
    part = torch.ones(count // n, dtype=torch.float32, device=device)
    return {"all_reduce": lambda: dist.all_reduce(whole),
            "all_gather": lambda: gather(whole, part),
            "reduce_scatter": lambda: scatter(part, whole),
            "broadcast": lambda: dist.broadcast(whole, src=0)}[op]


def _time_loop(spec: RunSpec, op: str, size: int, device) -> float:
    """Seconds per operation: warm-up, barrier, then ``comm_iters`` back to back between syncs."""
    import torch.distributed as dist

    from harness.dist import synchronize

    fn = _operation(op, element_count(op, size, spec.world_size), spec.world_size, device)
    for _ in range(spec.comm_warmup_iters):
        fn()
    synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(spec.comm_iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / spec.comm_iters


def _time_each(spec: RunSpec, device) -> list[float]:
    """The largest all_reduce, ``comm_iters`` times, each between two syncs."""
    from harness.dist import synchronize

    fn = _operation("all_reduce", element_count("all_reduce", spec.comm_max_bytes, spec.world_size),
                    spec.world_size, device)
    fn()
    out = []
    for _ in range(spec.comm_iters):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - start)
    return out
