"""FSDP2: ``fully_shard`` on every transformer block, then on the root."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def apply_fsdp(model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
    """Shard parameters, gradients and optimizer state; one unit per block (torchtitan order).

    Parameters stay fp32 (no MixedPrecisionPolicy): precision comes from autocast, as for
    every strategy, so all of them compute the same thing.
    """
    mesh = init_device_mesh(device.type, (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)  # embeddings, tied head and final norm
    return model
