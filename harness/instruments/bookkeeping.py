"""What a strategy's own code moves through memory in a step, beside the model's operators.

FSDP and DeepSpeed do memory-bound work of their own around every collective: copying shards into the
all-gather buffer and the gathered parameters out of it, copying gradients into the reduce buffer,
dividing them, casting them to the reduce dtype and back, accumulating shards. Asked for as instrument
``bookkeeping``, each rank runs that many more optimizer steps under a ``TorchDispatchMode`` after the
measured steps and tallies every operator that is a kernel (no view, no collective: those are
harness/traffic.py's) and that the strategy's own code issues: the innermost Python frame it comes from,
outside torch's dispatch plumbing, is in ``STRATEGY_CODE`` (torch/distributed/fsdp, DeepSpeed's runtime).
Bytes are read plus written, counted as planner/opcount.py counts the model's operators: the inputs and
each output that is not an input.

One piece of it has no frame of the strategy's: FSDP1 (``use_orig_params=True``) hands the module
views of its flat parameter in forward, so autograd's engine, in C++, concatenates a unit's gradients
into the flat parameter's (the views' backward) and accumulates them there across micro-batches. Those
operators are told by what they make: a 1-D tensor of a flat parameter's unsharded size, in backward,
from no frame of the model's (``where`` "autograd:flat_param").

DDP's reducer is C++ too, called from autograd's hooks: its operators are told by what they touch. The
copy into a bucket divided by N is the one ``aten.mul.out`` of a backward (autograd's formulas return new
tensors), the copy back is a ``copy_`` to or from a parameter's ``.grad`` (``where``
"autograd:ddp_reducer"); an in-place ``add_`` into a ``.grad`` is autograd's AccumulateGrad adding a
micro-batch's gradient under no_sync ("autograd:accumulate_grad"), the same in FSDP2, whose unsharded
parameters keep their gradients whole until the step's reduce. A DDP communication hook is Python
(torch/distributed/algorithms/ddp_comm_hooks) and is told by its frame.

Per row: where (module:function), the operator, bytes and count, one step's worth (summed over the
steps, divided by them). harness/bookkeeping.py states the same per strategy and
tests/harness/test_bookkeeping.py holds each term to it at ws2. Those steps are never measured steps:
the mode adds Python to every operator.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

# the code whose operators are a strategy's bookkeeping (path fragments of the issuing frame's file)
STRATEGY_CODE = ("/torch/distributed/fsdp/", "/deepspeed/runtime/",
                 "/torch/distributed/algorithms/ddp_comm_hooks/")
# not bookkeeping although under DeepSpeed's runtime: ZeRO-3's autograd Function for the model's linear
# layers (the model's own matmul), and DeepSpeed's optimizer wrapper calling the client optimizer
MODEL_CODE = ("/deepspeed/runtime/zero/linear.py",)
FSDP2_COPY_IN = "fsdp.all_gather_copy_in"  # its buffer argument is written only in this rank's slice
# operators that launch no kernel (allocation, metadata), as planner/opcount.py leaves them out
NO_KERNEL = {"detach", "lift_fresh", "empty", "empty_strided", "empty_like", "_local_scalar_dense",
             "_unsafe_view", "is_same_size", "_has_compatible_shallow_copy_type", "new_empty",
             "new_empty_strided", "set_", "resize_", "record_stream"}
# frames between an operator's caller and the mode: torch's dispatch plumbing and decorators
PLUMBING = ("/torch/utils/_python_dispatch.py", "/torch/_ops.py", "/torch/_tensor.py", "/torch/functional.py",
            "/torch/_library/", "/torch/utils/_contextlib.py", "/torch/autograd/grad_mode.py",
            "/torch/_dynamo/", "/torch/_compile.py", "/contextlib.py", "/torch/overrides.py",
            "/torch/_jit_internal.py", __file__)


def issuer() -> str | None:
    """``module:function`` of the strategy code that issued the operator being dispatched; "autograd"
    where autograd's engine runs it (no Python frame but the ``backward()`` call's); else None."""
    frame = sys._getframe(2)
    while frame is not None and any(p in frame.f_code.co_filename for p in PLUMBING):
        frame = frame.f_back
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if "/torch/autograd/" in path:
        return "autograd"
    if any(p in path for p in MODEL_CODE) or not any(p in path for p in STRATEGY_CODE):
        return None
    module = path.split("/site-packages/")[-1].removesuffix(".py").replace("/", ".")
    return f"{module}:{frame.f_code.co_name}"


def record(run: Any) -> dict:
    """``run.steps`` optimizer steps of ``run.engine`` under the tally: ``{"steps": n, "rows": [{"where",
    "op", "bytes", "count"}, ...]}`` (one step's worth), largest first."""
    module = run.engine.module
    mode, tally, counts = tallying(_flat_param_numels(module), _gradients(module), _is_ddp(module))

    from harness.parallel.engine import train_step  # the steps as the measured ones run

    for micro_batches in run.step_batches(run.steps):
        with mode():
            train_step(run.engine, micro_batches)
    rows = [{"where": w, "op": op, "bytes": b / run.steps, "count": counts[(w, op)] / run.steps}
            for (w, op), b in tally.items()]
    return {"steps": run.steps, "rows": sorted(rows, key=lambda r: (-r["bytes"], r["where"], r["op"]))}


def tallying(flat: set[int] | frozenset[int] = frozenset(), gradients: Any = None,
             reducer: bool = False) -> tuple[Any, Counter, Counter]:
    """(a ``TorchDispatchMode`` class, bytes and counts by (where, op)): under the mode every operator the
    strategy's code issues is tallied (module docstring); ``flat``: FSDP1's flat parameters' unsharded
    sizes; ``gradients``: a callable giving the gradients autograd accumulates into whole (DDP's, FSDP2's
    unsharded parameters'); ``reducer``: a DDP step's, its reducer's copies told apart."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    tally: Counter[tuple[str, str]] = Counter()
    counts: Counter[tuple[str, str]] = Counter()

    class Tally(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.namespace in ("c10d", "_c10d_functional") or _is_view(func) or \
                    func.overloadpacket.__name__ in NO_KERNEL:
                return out
            where = issuer()
            if where == "autograd" and gradients is not None:
                where = _autograd_where(func, args, kwargs, gradients, reducer)
            elif where == "autograd":  # the strategy's only where it makes a flat parameter's gradient
                made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                ours = any(t.dim() == 1 and t.numel() in flat for t in made)
                where = "autograd:flat_param" if ours else None
            moved = _moved(torch, tree_flatten, func, args, kwargs, out) if where else 0
            if moved:
                key = (where, f"{func.namespace}.{func.overloadpacket.__name__}")
                tally[key] += moved
                counts[key] += 1
            return out

    return Tally, tally, counts


def _is_ddp(module: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def _gradients(module: Any) -> Any:
    """A callable giving the gradients of ``module`` that autograd accumulates into whole under no_sync:
    DDP's parameters', FSDP2's unsharded parameters' (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    ``_unsharded_param``); None for another strategy."""
    if _is_ddp(module):
        params = list(module.parameters())
        return lambda: [p.grad for p in params if p.grad is not None]
    from torch.distributed.fsdp import FSDPModule

    groups = [group for sub in module.modules() if isinstance(sub, FSDPModule)
              for group in sub._get_fsdp_state()._fsdp_param_groups]
    if not groups:
        return None
    return lambda: [fp._unsharded_param.grad for group in groups for fp in group.fsdp_params
                    if hasattr(fp, "_unsharded_param") and fp._unsharded_param.grad is not None]


def _autograd_where(func: Any, args: tuple, kwargs: dict, gradients: Any, reducer: bool) -> str | None:
    """Where an operator autograd runs comes from (module docstring): DDP's reducer, autograd's
    accumulation into a whole ``.grad``, or neither (the model's backward)."""
    name = func.overloadpacket.__name__
    if reducer and name == "mul" and func._overloadname == "out":
        return "autograd:ddp_reducer"
    if name not in ("copy_", "add_"):
        return None
    grads = {g.data_ptr() for g in gradients()}
    touched = [a.data_ptr() for a in (*args[:2], kwargs.get("src")) if hasattr(a, "data_ptr")]
    if reducer and name == "copy_" and any(t in grads for t in touched):
        return "autograd:ddp_reducer"
    if name == "add_" and touched and touched[0] in grads:
        return "autograd:accumulate_grad"
    return None


def _flat_param_numels(module: Any) -> set[int]:
    """The unsharded sizes of FSDP1's flat parameters in ``module`` (none for another strategy)."""
    sizes = set()
    for sub in module.modules():
        handle = getattr(sub, "_handle", None)
        flat = getattr(handle, "flat_param", None)
        if flat is not None:
            sizes.add(int(flat._unpadded_unsharded_size.numel()))
    return sizes


def _moved(torch: Any, flatten: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an operator reads and writes: each argument it reads, each it writes (an in-place
    operator's ``self`` both, a copy's destination and an ``out=`` only written), each returned tensor
    that is no argument. FSDP2's all-gather copy-in reads its shards and writes as many bytes into its
    slice of the gathered buffer (the buffer it is handed is not written beyond that slice)."""
    def size(tensors: list) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    def tensors(value: Any) -> list:
        return [t for t in flatten(value)[0] if isinstance(t, torch.Tensor)]

    name = func.overloadpacket.__name__
    if f"{func.namespace}.{name}" == FSDP2_COPY_IN:
        return 2 * size(tensors(args[0]))
    bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
    written_only = "copy" in name or name.endswith("_out")
    read: list = []
    written: list = []
    for argument in func._schema.arguments:
        value = tensors(bound.get(argument.name))
        if argument.alias_info is not None and argument.alias_info.is_write:
            written += value
            if not (written_only or argument.kwarg_only):
                read += value  # an in-place update reads what it writes
        else:
            read += value
    given = read + written
    returned = [t for t in tensors(out) if not any(t is g for g in given)]
    return size(read) + size(written) + size(returned)


def _is_view(func: Any) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
