"""Classic FullyShardedDataParallel with a transformer-block wrap policy; variants: SHARD_GRAD_OP
(no resharding after forward), bf16 gradient reduction, CPU offload."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from harness import compiled
from harness.parallel.engine import TorchEngine, apply_before_wrap, common_config, make_optimizer
from harness.spec import RunSpec


def build(model: nn.Module, spec: RunSpec, device: torch.device) -> tuple[TorchEngine, dict[str, Any]]:
    """FULL_SHARD, one FSDP unit per transformer block, root unit for embeddings and head.
    ``use_orig_params=True`` lets a unit hold frozen and trainable parameters (LoRA), as the
    FSDP docs require for that.

    ``device_id`` is given on CPU too: classic FSDP otherwise refuses to run without an
    accelerator ("FSDP needs a non-CPU accelerator device").
    """
    parts, config = spec.variant_parts(), common_config(spec)
    apply_before_wrap(model, spec, config)
    options = wrap_options(parts, native=spec.precision == "native")
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({model.block_class}),
                                       use_orig_params=True, device_id=device, **options)
    config.update(wrapper="FullyShardedDataParallel (FSDP1)",
                  wrap_policy=f"ModuleWrapPolicy({{{model.block_class.__name__}}})",
                  use_orig_params=True, **{k: getattr(v, "name", repr(v)) for k, v in options.items()})
    runs = compiled.whole(wrapped) if compiled.wanted(spec) else wrapped
    if runs is not wrapped:
        config["compile"] = "torch.compile(FullyShardedDataParallel(model, use_orig_params=True))"
    engine = TorchEngine(runs, make_optimizer(wrapped, spec), spec=spec, device=device,
                         sync=lambda last: contextlib.nullcontext() if last else wrapped.no_sync(),
                         clip=wrapped.clip_grad_norm_)
    return engine, config


def wrap_options(parts: dict[str, int | None], *, native: bool = False) -> dict[str, Any]:
    """``FullyShardedDataParallel`` keyword arguments for the variant's parts (``native``: dtype bf16
    as FSDP1 runs it, bf16 parameters and buffers with fp32 reduction, bf16 with bf16-reduce)."""
    options: dict[str, Any] = {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP if "noreshard" in parts
                               else ShardingStrategy.FULL_SHARD}
    if native:
        reduce = torch.bfloat16 if "bf16-reduce" in parts else torch.float32
        options["mixed_precision"] = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce,
                                                    buffer_dtype=torch.bfloat16)
    elif "bf16-reduce" in parts:
        options["mixed_precision"] = MixedPrecision(reduce_dtype=torch.bfloat16)
    if "offload" in parts:
        options["cpu_offload"] = CPUOffload(offload_params=True)
    return options
