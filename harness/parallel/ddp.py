"""PyTorch DistributedDataParallel."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: nn.Module, *, device: torch.device) -> DistributedDataParallel:
    """Replicate ``model`` on every rank; gradients all-reduced in 25 MB buckets (default)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
