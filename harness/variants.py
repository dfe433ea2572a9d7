"""The variant table: every knob a user turns with a strategy (``--variant``), one row each, with what
each side of the project does with it: the strategies that run it (a strategy row's ``variants``, in
harness/strategies.py), whether a device or layout rules it out (``problem``), whether the memory planner
plans it and the step-time predictor times it (``unplanned``, ``untimed``: the reason where not), and the
words published runs use for it. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """A knob users turn with a strategy. ``why_not`` says why a strategy lacking it cannot run
    it; ``problem`` rules out a device or layout for every strategy; ``projected``: the
    projection's traffic model describes it (it changes nothing, or the row's sends say how)."""

    name: str
    doc: str
    why_not: str = ""
    numbered: bool = False  # takes a number: bucket100, powersgd4
    projected: bool = True
    problem: Callable[[str, int], str | None] = lambda device, nnodes: None  # (device, nnodes)
    unplanned: str = ""  # why the memory planner plans no case with it ("": it plans it)
    untimed: str = ""  # why the step-time predictor times no case with it ("": it times it)
    recompute: tuple[str, ...] = ()  # the words published runs use for it ("recompute": "full")

    @property
    def spelling(self) -> str:
        """How it is written in a variant name: ``bucket<N>`` for a numbered part."""
        return self.name + ("<N>" if self.numbered else "")


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("ac", "activation checkpointing of every transformer block (non-reentrant), before wrapping",
            recompute=("full",)),
    Variant("ac-op", "torchtitan's op-level selective activation checkpointing: every block, saving matmul "
                     "(but every second), attention and reduce-scatter outputs (harness/recompute.py)",
            recompute=("selective-op",)),
    Variant("ac-every", "activation checkpointing of every N-th transformer block (torchtitan's selective "
                        "layer AC)", numbered=True),
    Variant("offload", "parameters/optimizer state offloaded to CPU memory (FSDP CPU offload, ZeRO offload)",
            why_not="DDP keeps a full replica on every device: nothing to offload", projected=False,
            unplanned="state offloaded to CPU memory leaves the device",
            untimed="the predictor has no model of offloaded state's PCIe traffic",
            problem=lambda device, nnodes: (
                "variant offload moves state from the accelerator to CPU memory: meaningless on a CPU-only "
                "run") if device == "cpu" else None),
    Variant("bf16-reduce", "gradients reduced in bf16"),
    Variant("compile", "torch.compile as each stack's users apply it: FSDP2 per block before fully_shard, "
                       "FSDP1 and DDP compiled whole, DeepSpeed's engine.compile() (harness/compiled.py)"),
    Variant("autocast", "with dtype bf16: torch.autocast and fp32 parameters for every strategy, instead "
                        "of the strategy's own mixed precision (the parity setting)",
            why_not="DDP's bf16 is torch.autocast already"),
    Variant("powersgd", "DDP PowerSGD gradient compression of that rank, error feedback on",
            why_not="PowerSGD is a DDP communication hook", numbered=True, projected=False,
            untimed="the predictor has no model of PowerSGD's compression compute"),
    Variant("bucket", "gradient bucket size in MiB (DDP bucket_cap_mb; ZeRO reduce_bucket_size)",
            why_not="FSDP reduces per wrapped unit, it has no bucket size", numbered=True),
    Variant("noreshard", "parameters kept unsharded after forward (FSDP2 reshard_after_forward=False, "
                         "FSDP1 SHARD_GRAD_OP)", why_not="only FSDP reshards parameters after forward"),
    Variant("hsdp", "FSDP2 on a 2-D mesh: replicated across nodes, sharded within each node (multi-node "
                    "cases)",
            why_not="HSDP here is FSDP2 fully_shard on a 2-D device mesh (FSDP1's HYBRID_SHARD, tried on "
                    "two CPU nodes, left DDP's loss curve by 5%: not run until that is understood)",
            projected=False,
            problem=lambda device, nnodes: (
                "variant hsdp replicates across nodes and shards within each: this case runs on one node "
                "(plain fsdp is the same thing there)") if nnodes == 1 else None),
)}
