"""The step at a stated MFU (``llmbench-plan --mfu``): planner/step.py's model with compute = tokens x
model FLOPs / (peak x MFU), the strategy table's traffic (harness/strategies.py, held to measured bytes)
over a declared link, and a stated share of the compute hiding it. Standard library only. The MFU is
the user's; ``--time`` (planner/steptime.py) predicts it instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.shapes import payloads, spec_flops_per_token
from harness.spec import RunSpec
from harness.strategies import Strategy
from pytest_llmbench.planner.step import Bandwidth, Overlap, comm_s


@dataclass(frozen=True)
class StepTime:
    """One optimizer step on N ranks, estimated: compute at a stated MFU, plus the communication
    of the strategy table's formula (harness/strategies.py, held to measured traffic at ws2 and ws4)
    at a stated bus bandwidth, of which ``overlap`` x compute is hidden (0: nothing hidden, an
    upper bound on the step). Bandwidth only: message latency is not counted."""

    strategy: str
    world_size: int
    compute_s: float
    comm_s: dict[str, float]  # op -> seconds
    overlap: float
    mfu: float
    busbw_gbps: float
    tokens_per_step: int  # over all ranks
    seq_len: int

    @property
    def communication_s(self) -> float:
        return sum(self.comm_s.values())

    @property
    def exposed_s(self) -> float:
        return Overlap(hides=self.overlap).exposed_s(self.communication_s, self.compute_s)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def samples_per_s(self) -> float:
        return self.tokens_per_s / self.seq_len

    def describe(self) -> str:
        comm = " + ".join(f"{op} {s:.3f} s" for op, s in self.comm_s.items() if s) or "none"
        return (f"compute {self.compute_s:.3f} s (model FLOPs at MFU {self.mfu:.0%}) + communication "
                f"{comm} at {self.busbw_gbps:g} GB/s busbw, {self.overlap:.0%} of compute hiding it")


def step_time(row: Strategy, spec: RunSpec, world_size: int, *, grad_accum: int, peak_flops: float,
              mfu: float, busbw_gbps: float, overlap: float = 0.0) -> StepTime:
    """The estimated step of ``spec`` (model, workload, variant, micro-batch, seq len) at N ranks.

    compute = tokens per rank x FLOPs per token (harness/flops.py: 6N + 12LHQT, 4N_frozen + ... for
    frozen weights) / (peak x MFU); the MFU counts model FLOPs, so what recompute costs (variant ac)
    is in the MFU stated. Communication per op = bytes of the formula at ``grad_accum``
    micro-batches (harness/shapes.py payloads: with dtype bf16 what the strategy's own mixed
    precision sends in bf16 at 2 B, RunSpec.precision) x bus factor(op, N) / busbw."""
    if not 0 < mfu <= 1 or peak_flops <= 0 or busbw_gbps <= 0 or not 0 <= overlap <= 1:
        raise ValueError(f"mfu {mfu} in (0, 1], peak_flops {peak_flops} and busbw_gbps {busbw_gbps} "
                         f"above 0, overlap {overlap} in [0, 1]")
    spec = spec.replace(strategy=row.name)  # its payloads are this strategy's (bf16 widths per row)
    parts = spec.variant_parts()
    comm: dict[str, float] = {}
    if world_size > 1:
        sent = row.stated_bytes(parts, payloads(spec), grad_accum)
        link = Bandwidth("declared", declared_gbps=busbw_gbps)
        comm = comm_s([(op, size, 1) for op, size in sent.items()], link, world_size)
    tokens_per_rank = spec.micro_batch * spec.seq_len * grad_accum
    compute = tokens_per_rank * spec_flops_per_token(spec) / (peak_flops * mfu)
    return StepTime(row.name, world_size, compute, comm, overlap, mfu, busbw_gbps,
                    tokens_per_rank * world_size, spec.seq_len)
