"""Integrity checks of a run, taken outside the timed steps: did the frozen weights stay
bit-identical and did the trained ones change?

Each rank fingerprints the parameter data it holds (its shard under FSDP and ZeRO-3, the whole
tensor under DDP and ZeRO-2) right after wrapping and again after the last step, so no strategy
has to gather anything. A fingerprint is exact: the sum over the raw bytes of byte x (position
mod 65521 + 1), in int64 on the device; any changed byte changes it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CHUNK = 1 << 24  # bytes per int64 pass (128 MiB of int64), so a 7B model needs no 8x copy


def fingerprint(tensors: list[torch.Tensor]) -> tuple[int, int]:
    """(fingerprint, bytes) of the tensors' raw data, in order."""
    total, offset = 0, 0
    for tensor in tensors:
        data = tensor.detach().contiguous().view(-1).view(torch.uint8)
        for start in range(0, data.numel(), CHUNK):
            chunk = data[start:start + CHUNK].to(torch.int64)
            weights = torch.arange(offset + start, offset + start + chunk.numel(), device=chunk.device,
                                   dtype=torch.int64) % 65521 + 1
            total = (total + int((chunk * weights).sum())) % (1 << 61)
        offset += data.numel()
    return total, offset


def local_data(param: nn.Parameter) -> torch.Tensor:
    """The part of a parameter this rank holds: a DTensor's local shard (FSDP2), a ZeRO-3
    partition (``ds_tensor``), else the tensor itself."""
    if hasattr(param, "ds_tensor"):
        return param.ds_tensor
    if hasattr(param, "to_local"):
        return param.to_local()
    return param


def digests(module: nn.Module) -> dict[str, list[int]]:
    """{"frozen": [fingerprint, bytes], "trainable": [...]} of this rank's parameter data."""
    groups: dict[str, list[torch.Tensor]] = {"frozen": [], "trainable": []}
    for _, param in sorted(module.named_parameters(), key=lambda item: item[0]):
        groups["trainable" if param.requires_grad else "frozen"].append(local_data(param))
    return {name: list(fingerprint(tensors)) for name, tensors in groups.items()}


def compare(before: list[dict[str, list[int]]], after: list[dict[str, list[int]]]) -> dict[str, Any]:
    """Per-rank fingerprints before and after training -> what the result records."""
    frozen_bytes = sum(b["frozen"][1] for b in before)
    trainable_bytes = sum(b["trainable"][1] for b in before)
    return {
        "frozen_bytes_checked": frozen_bytes,
        "frozen_unchanged": all(b["frozen"] == a["frozen"] for b, a in zip(before, after, strict=True)),
        "trainable_bytes_checked": trainable_bytes,
        "trainable_changed": any(b["trainable"][0] != a["trainable"][0]
                                 for b, a in zip(before, after, strict=True)),
        "method": "per rank, its own shard of each parameter, fingerprinted after wrapping and after "
                  "the last step (harness/checks.py)",
    }
