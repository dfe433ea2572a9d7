"""FSDP2: ``fully_shard`` on every transformer block, then on the root; variants: no
resharding after forward, bf16 gradient reduction, CPU offload, HSDP (a 2-D mesh)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from harness import compiled
from harness.parallel.engine import TorchEngine, apply_before_wrap, common_config, fsdp2_sync, make_optimizer
from harness.spec import RunSpec


def build(model: nn.Module, spec: RunSpec, device: torch.device) -> tuple[TorchEngine, dict[str, Any]]:
    """Shard parameters, gradients and optimizer state; one unit per block (torchtitan order), the
    root kept gathered from forward to backward.

    With dtype bf16 (RunSpec.precision "native") torchtitan's MixedPrecisionPolicy: parameters
    gathered and computed in bf16, fp32 shards, gradients reduced in fp32 (bf16 with bf16-reduce);
    else parameters stay fp32 and precision comes from autocast (fp32, or the variant autocast).
    """
    parts, config = spec.variant_parts(), common_config(spec)
    apply_before_wrap(model, spec, config)
    options = shard_options(parts, native=spec.precision == "native")
    if "hsdp" in parts:  # replicate over nodes, shard over the ranks of a node
        mesh = init_device_mesh(device.type, (spec.nnodes, spec.nproc_per_node),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (spec.world_size,))
    if compiled.wanted(spec):  # torchtitan's order: recompute, compile each block, then fully_shard
        compiled.blocks(model)
        config["compile"] = f"each {model.block_class.__name__} compiled in place before fully_shard"
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **options)
    # The root (embeddings, head, final norm) is what backward needs first: kept unsharded after
    # forward, as fully_shard's docs advise and its default (None) does. An explicit True, as the
    # blocks get, would reshard it and gather it again at once (torch >= 2.6 honours it on the root).
    fully_shard(model, mesh=mesh, **{**options, "reshard_after_forward": False})
    config.update(wrapper="FSDP2 fully_shard", wrap_policy=f"each {model.block_class.__name__}, then root",
                  param_dtype="bf16" if spec.precision == "native" else "fp32",
                  device_mesh=f"{tuple(mesh.shape)} {mesh.mesh_dim_names or ('shard',)}",
                  **{k: repr(v) if not isinstance(v, bool) else v for k, v in options.items()},
                  root_reshard_after_forward=False)
    engine = TorchEngine(model, make_optimizer(model, spec), spec=spec, device=device,
                         sync=lambda last: fsdp2_sync(model, last),
                         clip=lambda c: nn.utils.clip_grad_norm_(model.parameters(), c))
    return engine, config


def shard_options(parts: dict[str, int | None], *, native: bool = False) -> dict[str, Any]:
    """``fully_shard`` keyword arguments for the variant's parts (``native``: bf16 parameters)."""
    options: dict[str, Any] = {"reshard_after_forward": "noreshard" not in parts}
    reduce = torch.bfloat16 if "bf16-reduce" in parts else torch.float32
    if native:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
    elif "bf16-reduce" in parts:
        options["mp_policy"] = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    if "offload" in parts:
        options["offload_policy"] = CPUOffloadPolicy()
    return options
