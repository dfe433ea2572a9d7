"""Seeded synthetic tokens, laid out like a DistributedSampler.

Global sample ``g`` of micro-step ``m`` of step ``s`` is row
``((s * grad_accum + m) * world_size + rank) * micro_batch + j`` of an endless stream,
so every rank sees distinct samples and the global order depends only on the seed,
the world size and the batch shape: never on the strategy. The stream cycles through
``data_pool`` distinct rows so the loss falls and runs can be checked against each other.
All batches are built and moved to the device before the timed loop.
"""

from __future__ import annotations

import torch

from harness.spec import RunSpec


def sample(spec: RunSpec, row: int) -> torch.Tensor:
    """Row ``row`` of the stream: seq_len + 1 tokens (inputs and shifted targets)."""
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + row % spec.data_pool)
    return torch.randint(0, spec.vocab_size, (spec.seq_len + 1,), generator=gen)


def rank_batches(spec: RunSpec, rank: int, steps: int, device: torch.device,
                 ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """batches[step][micro] = (inputs, targets) of this rank, each (micro_batch, seq_len)."""
    out = []
    for step in range(steps):
        micro = []
        for m in range(spec.grad_accum):
            first = ((step * spec.grad_accum + m) * spec.world_size + rank) * spec.micro_batch
            rows = torch.stack([sample(spec, first + j) for j in range(spec.micro_batch)])
            rows = rows.to(device)
            micro.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
        out.append(micro)
    return out
