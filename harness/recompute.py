"""Activation recompute: the policies people train with, as variants of every strategy.

    ac          every transformer block checkpointed (torch's non-reentrant checkpoint_wrapper): backward
                runs each block's forward again
    ac-every<K> every K-th block checkpointed, the others keep their activations: torchtitan's "selective
                layer" AC (``selective_ac_option = K``: the i-th block, counted from 1, is wrapped when
                i % K == 0), so floor(L / K) of L blocks recompute
    ac-op       torchtitan's op-level selective AC (``selective_ac_option = "op"``, its default for
                Llama 3): every block is checkpointed under a policy that saves the outputs of the ops in
                ``SAVE_OPS`` except every second ``aten.mm`` of the block's forward, and recomputes
                everything else (norms, activations, rotary, element-wise: the cheap memory-bound ops)

Source of ac-op: pytorch/torchtitan, torchtitan/parallelisms/parallelize_llama.py (``_save_list`` and
``_custom_policy``, 2024; moved to torchtitan/distributed/activation_checkpoint.py in 2025): the policy
counts ``aten.mm.default`` calls in the forward and in the recompute separately, and saves an op's output
when the op is in the list and is not an even-numbered mm. Two notes on what that policy does to a model
other than torchtitan's own Llama:
- a linear layer with a bias runs as ``aten.addmm``, which is not in the list: it is recomputed, and is
  not counted as an mm (Qwen2's q/k/v projections);
- on CPU scaled-dot-product attention runs as ``aten._scaled_dot_product_flash_attention_for_cpu``;
  torchtitan lists every SDPA backend it runs on (efficient, flash, later cudnn), so the CPU kernel of the
  same op is listed here too: attention is saved, never recomputed, on every device.

All three wrap the blocks before any strategy wraps the model (torchtitan's order: AC, then compile, then
fully_shard). The result's ``config.activation_checkpointing`` says which policy ran.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

# The recompute parts of a variant name: at most one of them in a variant.
PARTS = ("ac", "ac-op", "ac-every")


@dataclass(frozen=True)
class Recompute:
    """What a variant recomputes: ``policy`` "none", "full" (whole blocks) or "op" (torchtitan's op-level
    policy), on every ``every``-th block."""

    policy: str = "none"
    every: int = 1

    @classmethod
    def of(cls, parts: dict[str, int | None]) -> Recompute:
        """The recompute of a variant's parts (RunSpec.variant_parts())."""
        if "ac-op" in parts:
            return cls("op")
        if "ac-every" in parts:
            return cls("full", int(parts["ac-every"] or 1))
        if "ac" in parts:
            return cls("full")
        return cls()

    def blocks(self, n_layer: int) -> int:
        """How many of ``n_layer`` blocks are checkpointed."""
        return 0 if self.policy == "none" else n_layer // self.every

    def describe(self, block_class: str) -> str:
        if self.policy == "op":
            return (f"every {block_class}, torchtitan's op-level selective policy (saves mm, attention and "
                    f"reduce-scatter outputs but every second mm; recomputes the rest), applied before "
                    f"wrapping")
        which = f"every {block_class}" if self.every == 1 else f"every {self.every}th {block_class} (1-based)"
        return f"{which}, torch checkpoint_wrapper NO_REENTRANT, applied before wrapping"


def save_ops() -> set:
    """The ops whose outputs torchtitan's op-level policy saves (``_save_list``), and the CPU SDPA kernel."""
    import torch

    aten = torch.ops.aten
    ops = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_flash_attention.default,
           aten._scaled_dot_product_flash_attention_for_cpu.default,
           torch.ops._c10d_functional.reduce_scatter_tensor.default}
    cudnn = getattr(aten, "_scaled_dot_product_cudnn_attention", None)
    return ops | ({cudnn.default} if cudnn is not None else set())


def op_policy_context():
    """A fresh selective-checkpoint context for one checkpointed block's forward and its recompute
    (torch.utils.checkpoint.create_selective_checkpoint_contexts), with torchtitan's policy."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved, mm, counts = save_ops(), torch.ops.aten.mm.default, defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            counts[key] += 1
        keep = func in saved and not (func == mm and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply(model, recompute: Recompute) -> None:
    """Wrap ``model``'s blocks (``model.blocks``, instances of ``model.block_class``) for ``recompute``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    if recompute.policy == "none":
        return
    blocks = model.blocks
    for i, name in enumerate(list(blocks._modules), start=1):
        if i % recompute.every:
            continue
        options = {"context_fn": op_policy_context} if recompute.policy == "op" else {}
        wrapped = checkpoint_wrapper(blocks._modules[name], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                     **options)
        blocks.register_module(name, wrapped)
