"""Measured traffic: every collective one training step issues, as the strategy's own code calls it.

Each torch.distributed collective, whoever calls it (DDP's C++ reducer, FSDP2, FSDP1, DeepSpeed
through ``deepspeed.comm``), goes through the dispatcher as a ``c10d`` op (``c10d::allreduce_``,
``c10d::_allgather_base_``, ...); torch.compile'd and DTensor code issues ``_c10d_functional``
ops. ``recording()`` is a TorchDispatchMode that sees each of them on the calling rank and
writes down op, process-group size, dtype and bytes: exact, with no hook in any wrapper and no
change to what runs. The harness records the last warm-up step (a steady one from the third
step on: DDP rebuilds its buckets in the second iteration, ZeRO-3 traces its first), never a
measured step: the mode adds Python to every op of the step it watches.

A message's ``bytes`` is S of nccl-tests' doc/PERFORMANCE.md, the size of the whole array
(all_gather: the gathered output; reduce_scatter: the input; all_reduce, broadcast: the
tensor), so ``bytes x bus_factor(op, n) / busbw`` is its time at the probe's bus bandwidth.
A coalesced call is one message of the summed size. Messages of at most ``CONTROL_BYTES``
(a gradient norm, an overflow flag) are kept but are not what a strategy's formula counts.

The row functions are standard library only (the report reads stored rows); torch is imported
by ``recording`` alone.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from harness.bandwidth import OPS, bus_factor

CONTROL_BYTES = 8  # a scalar: grad-norm and overflow reductions, not parameter or gradient traffic

# c10d op -> (collective, the schema argument whose tensors make S)
C10D_OPS: dict[str, tuple[str, str]] = {
    "allreduce_": ("all_reduce", "tensors"),
    "allreduce_coalesced_": ("all_reduce", "tensors"),
    "_allgather_base_": ("all_gather", "output_tensor"),
    "allgather_": ("all_gather", "output_tensors"),
    "allgather_coalesced_": ("all_gather", "output_lists"),
    "allgather_into_tensor_coalesced_": ("all_gather", "outputs"),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor"),
    "reduce_scatter_": ("reduce_scatter", "input_tensors"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs"),
    "broadcast_": ("broadcast", "tensors"),
    "reduce_": ("reduce", "tensors"),
    "alltoall_": ("all_to_all", "input_tensors"),
    "alltoall_base_": ("all_to_all", "input"),
    "gather_": ("gather", "output_tensors"),
    "scatter_": ("scatter", "input_tensors"),
    "send": ("send", "tensors"),
    "recv_": ("recv", "tensors"),
    "barrier": ("barrier", ""),
}
# _c10d_functional op -> collective; S is the input, times the group size for all_gather
FUNCTIONAL_OPS: dict[str, str] = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "all_to_all_single": "all_to_all",
}


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Record every collective issued inside the block on this rank: yields the list of messages
    ({"op", "group_size", "dtype", "bytes"}, in call order), filled as the block runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    messages: list[dict[str, Any]] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace in ("c10d", "_c10d_functional"):
                message = _message(torch, func, args, kwargs)
                if message is not None:
                    messages.append(message)
            return func(*args, **kwargs)

    with Recorder():
        yield messages


def _message(torch: Any, func: Any, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """One message from a c10d or functional op call (None for wait_tensor and the like)."""
    bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
    name = func._schema.name.split("::")[1]
    tensors: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    if func.namespace == "c10d":
        if name not in C10D_OPS:
            return None
        op, argument = C10D_OPS[name]
        walk(bound.get(argument))
        group_size = _group_size(torch, bound.get("process_group"))
        factor = 1
    else:
        if name not in FUNCTIONAL_OPS:
            return None  # wait_tensor, broadcast_ bookkeeping
        op = FUNCTIONAL_OPS[name]
        walk(bound.get("input") if "input" in bound else bound.get("inputs"))
        group_size = bound.get("group_size")
        if group_size is None and "group_name" in bound:
            from torch.distributed.distributed_c10d import _resolve_process_group

            group_size = _resolve_process_group(bound["group_name"]).size()
        factor = group_size if op == "all_gather" else 1
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
    return {"op": op, "group_size": group_size, "dtype": "+".join(dtypes) or "-",
            "bytes": factor * sum(t.numel() * t.element_size() for t in tensors)}


def _group_size(torch: Any, group: Any) -> int | None:
    """Ranks in the op's process group: the dispatcher passes it boxed as a ScriptObject."""
    if group is None:
        return None
    if isinstance(group, torch.ScriptObject):
        group = torch.distributed.ProcessGroup.unbox(group)
    return group.size()


# ---- rows (standard library): what the result stores and the report reads --------------------

def summarize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages -> rows {op, group_size, dtype, bytes, count}, one per distinct message, largest first."""
    counts = Counter((m["op"], m["group_size"], m["dtype"], m["bytes"]) for m in messages)
    rows = [{"op": op, "group_size": n, "dtype": dtype, "bytes": size, "count": count}
            for (op, n, dtype, size), count in counts.items()]
    return sorted(rows, key=lambda r: (-r["bytes"], r["op"], r["dtype"]))


def bulk(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that carry parameters or gradients (above ``CONTROL_BYTES``)."""
    return [r for r in rows if r["bytes"] > CONTROL_BYTES]


def bytes_by_op(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes of the whole arrays per collective over the step (count x bytes), bulk rows only."""
    out: Counter[str] = Counter()
    for row in bulk(rows):
        out[row["op"]] += row["count"] * row["bytes"]
    return dict(out)


def bus_bytes(rows: list[dict[str, Any]], world_size: int) -> float:
    """Bytes each rank moves over its link in the step at ``world_size``: sum of count x S x
    bus_factor (nccl-tests' busbw convention), the collectives bus_factor knows."""
    return sum(r["count"] * r["bytes"] * bus_factor(r["op"], world_size) for r in rows if r["op"] in OPS)
