"""The operators of one training micro-batch, counted under ``FakeTensorMode`` (no memory, no time).

The step-time predictor (pytest_llmbench/planner/steptime.py) times each operator by a roofline of a device
it does not have; this module says what the operators are. A model is built twice, at two depths,
in the dtype it computes in, and one forward and backward of a micro-batch runs under a dispatch
mode that records every ATen operator: its class, FLOPs (``torch.utils.flop_counter``'s own
formulas), the bytes it reads and writes, and for matrix multiplies the (batch, M, N, K) shape.
What one block adds is the difference between the depths; the rest (embedding, head, loss) is the
shallow model less its blocks. Views move no bytes and are not kernels: they are left out.

Classes:
    gemm       mm, addmm, bmm, baddbmm and friends outside attention's core
    attention  the core of attention, whatever its eager decomposition: SDPA's own operators, and
               every operator that touches a (batch x heads, T, T) score tensor (QK^T, mask, alibi,
               softmax, dropout, PV and their gradients). The predictor replaces them by one fused
               flash-attention kernel per layer, as GPUs run them (flash or cuDNN SDPA).
    memory     everything else that is a kernel: element-wise, norms, embedding, loss, casts
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_llmbench.planner.fusion import Fused, Fusion

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm"}
# Operators that launch no kernel of their own (allocation-free metadata, RNG state).
# ``_unsafe_view`` returns a new tensor over the same storage (its schema declares no alias).
NO_KERNEL = {
    "detach",
    "lift_fresh",
    "empty",
    "empty_strided",
    "empty_like",
    "_local_scalar_dense",
    "_unsafe_view",
    "is_same_size",
    "_has_compatible_shallow_copy_type",
}


@dataclass
class Ops:
    """Totals of one class of operators."""

    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0
    gemms: list[tuple[int, int, int, int, float]] = field(default_factory=list)  # (batch, M, N, K, bytes)


@dataclass
class Count:
    """The operators of one micro-batch by phase ("forward", "backward") and class."""

    phases: dict[str, dict[str, Ops]] = field(
        default_factory=lambda: {
            p: {c: Ops() for c in ("gemm", "attention", "memory")} for p in ("forward", "backward")
        }
    )

    # the memory-bound operators as torch.compile fuses them (pytest_llmbench/planner/fusion.py), by phase
    fused: dict[str, Fused] = field(default_factory=lambda: {p: Fused() for p in ("forward", "backward")})

    def minus(self, other: Count) -> Count:
        out = Count()
        out.fused = {p: Fused(f.kernels - other.fused[p].kernels, f.bytes - other.fused[p].bytes)
                     for p, f in self.fused.items()}
        for p, classes in self.phases.items():
            for c, ops in classes.items():
                o = other.phases[p][c]
                mine = Ops(
                    ops.flops - o.flops,
                    ops.bytes - o.bytes,
                    ops.kernels - o.kernels,
                    _gemm_difference(ops.gemms, o.gemms),
                )
                out.phases[p][c] = mine
        return out


def _gemm_difference(a: list, b: list) -> list:
    """The gemms of ``a`` less one occurrence of each gemm in ``b`` (the deeper model's extra block)."""
    rest = list(a)
    for g in b:
        if g in rest:
            rest.remove(g)
    return rest


class _Recorder(TorchDispatchMode):
    def __init__(self, count: Count, score_shape: Callable[[torch.Size], bool]) -> None:
        super().__init__()
        self.count, self.phase, self.score_shape = count, "forward", score_shape
        self.fusion = Fusion()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if name in NO_KERNEL or _is_view(func) or not outs:  # metadata (prim.device, sizes) is no kernel
            return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        moved = sum(t.numel() * t.element_size() for t in ins)
        moved += sum(t.numel() * t.element_size() for t in outs if not any(t is i for i in ins))
        flops = _flops(func, args, kwargs, out)
        if (
            "scaled_dot_product" in name
            or "flash_attention" in name
            or "efficient_attention" in name
            or any(self.score_shape(t.shape) for t in ins + outs)
        ):
            kind = "attention"
        elif name in GEMMS:
            kind = "gemm"
        else:
            kind = "memory"
        self.fusion.record(self.phase, kind == "memory", ins, outs)
        ops = self.count.phases[self.phase][kind]
        ops.flops += flops
        ops.bytes += moved
        ops.kernels += 1
        if kind == "gemm":
            ops.gemms.append((*_mnk(name, args), moved))
        return out


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _flops(func, args, kwargs, out) -> float:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0.0
    return float(formula(*args, **kwargs, out_val=out))


def _mnk(name: str, args) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matrix multiply's arguments."""
    if name in ("addmm", "baddbmm"):
        a, b = args[1], args[2]
    else:
        a, b = args[0], args[1]
    if a.dim() == 3:
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    return 1, a.shape[0], b.shape[1], a.shape[1]


def count(
    build: Callable[[], torch.nn.Module],
    *,
    micro_batch: int,
    seq_len: int,
    vocab_size: int,
    heads: int,
    dtype: torch.dtype = torch.bfloat16,
) -> Count:
    """One forward and backward of ``build()``'s model (``forward(idx, targets) -> loss``) on a
    micro-batch of random tokens, every operator recorded. ``heads``: attention heads, to know a
    (batch x heads, T, T) score tensor."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pytest_llmbench.planner.memref import as_real_inputs

    def score_shape(shape: torch.Size) -> bool:
        if len(shape) < 3 or shape[-1] != seq_len or shape[-2] != seq_len:
            return False
        lead = 1
        for d in shape[:-2]:
            lead *= d
        return lead != micro_batch and lead % heads == 0 or lead == micro_batch * heads

    result = Count()
    with FakeTensorMode(), as_real_inputs(), quiet():
        model = build()
        for param in model.parameters():
            param.data = param.data.to(dtype)
        idx = torch.randint(0, vocab_size, (micro_batch, seq_len))
        recorder = _Recorder(result, score_shape)
        with recorder:
            loss = model(idx, idx)
            recorder.phase = "backward"
            loss.backward()
    result.fused.update(recorder.fusion.totals())
    return result


@contextlib.contextmanager
def quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# The keys transformers' configs name their positions by (learned tables, alibi and rope ranges).
POSITION_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions")


def with_positions(config: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """The config with room for ``seq_len`` positions: a run at a longer sequence sets its model's
    maximum to it (MPT's ``max_seq_len`` is such a run setting); the operators are those of that run."""
    return {k: max(v, seq_len) if k in POSITION_KEYS and isinstance(v, int) else v for k, v in config.items()}


CODE_KEYS = ("auto_map", "trust_remote_code", "_name_or_path", "name_or_path")


def hf_config(config: dict[str, Any]):
    import transformers

    values = dict(config)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise ValueError(
            "config.json has no model_type: transformers cannot tell which architecture to build"
        )
    # labels, and what would make transformers import code or reach the Hub (auto_map names a module
    # beside the config or in a Hub repository): a config is data, never code
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", *CODE_KEYS):
        values.pop(key, None)
    cfg = transformers.AutoConfig.for_model(model_type, **values)
    cfg.use_cache = False
    if model_type in ("llama", "mistral", "qwen2", "gpt2", "qwen3", "gemma", "phi3"):
        cfg._attn_implementation = "sdpa"
    return cfg
