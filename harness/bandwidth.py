"""Collective bandwidth as nccl-tests defines it (doc/PERFORMANCE.md): standard library only, read
by the collectives probe (harness/collectives.py) and the report's projection.

Bandwidths as nccl-tests doc/PERFORMANCE.md defines them, GB = 1e9 bytes, S = the size of the
whole array (for all_gather the gathered output, for reduce_scatter the input):

    algbw = S / t
    busbw = algbw x 2(n-1)/n   all_reduce
            algbw x (n-1)/n    all_gather, reduce_scatter
            algbw x 1          broadcast

busbw is the figure to hold against the link: for ring algorithms it does not depend on n. The
ring's latency term counts its steps: 2(n-1) for all_reduce (a reduce-scatter then an all-gather
around the ring), n-1 for all_gather, reduce_scatter and broadcast. This module is the ring law's
one home: the projection (pytest_llmbench/planner/projection.py), the step-time predictor
(planner/steptime.py) and the stated-MFU step (planner/mfu.py) read it from here.
"""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
ELEMENT_BYTES = 4  # float32 buffers (nccl-tests' -d float)


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def ring_steps(op: str, n: int) -> int:
    """Latency steps of the ring algorithm for ``op`` on ``n`` ranks (a broadcast's chain: n-1 hops)."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return (2 if op == "all_reduce" else 1) * (n - 1)


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    return size_bytes / time_s / 1e9


def busbw_gbps(op: str, size_bytes: int, time_s: float, n: int) -> float:
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, n)


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min, 2 min, 4 min, ... up to max (nccl-tests -b MIN -e MAX -f 2)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def element_count(op: str, size_bytes: int, n: int) -> int:
    """Elements of the whole array for a message of ``size_bytes``: all_gather and
    reduce_scatter need a multiple of n (each rank's part), so the size is rounded down to
    one, as nccl-tests does; at least n elements."""
    count = max(size_bytes // ELEMENT_BYTES, 1)
    if op in ("all_gather", "reduce_scatter"):
        count = max(count - count % n, n)
    return count
