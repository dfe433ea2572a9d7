"""Classic FullyShardedDataParallel with a transformer-block wrap policy."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def apply_fsdp1(model: nn.Module, *, device: torch.device, block_cls: type[nn.Module]) -> nn.Module:
    """FULL_SHARD, one FSDP unit per ``block_cls``, root unit for embeddings and head.

    ``device_id`` is given on CPU too: classic FSDP otherwise refuses to run without an
    accelerator ("FSDP needs a non-CPU accelerator device").
    """
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({block_cls}),
                                    use_orig_params=True, device_id=device)
