"""What every strategy shares: the engine types, the optimizer, precision, and the variants
applied to the model before any wrapper (activation checkpointing).

An engine runs a micro-batch (``micro_step``) and an optimizer step (``optimizer_step``)
with the same semantics for every strategy:

- loss of a step = mean over its grad-accum micro-batches (each backward sees loss / k);
- gradients are synchronised only on the last micro-batch where the strategy allows it
  (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``, FSDP1 ``no_sync``); ZeRO-2/3
  reduce on every micro-batch by design, and the result records that;
- torch.optim.AdamW with the spec's lr/betas/eps/weight decay, decay on matrices only;
- global gradient-norm clipping at ``spec.grad_clip``;
- dtype bf16 as RunSpec.precision says: the strategy's own mixed precision ("native": FSDP's
  bf16 parameters with fp32 reduction, DeepSpeed's bf16 section), or bf16 autocast with fp32
  master weights ("autocast": DDP, the variant autocast, qlora); else fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from harness.spec import RunSpec


class TorchEngine:
    """DDP, FSDP2 and FSDP1: a torch module plus a torch optimizer."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, spec: RunSpec,
                 sync: Callable[[bool], contextlib.AbstractContextManager],
                 clip: Callable[[float], Any], device: torch.device) -> None:
        self.model, self.optimizer, self.spec = model, optimizer, spec
        self._sync, self._clip, self._device = sync, clip, device

    @property
    def module(self) -> nn.Module:
        """The wrapped model, whose parameters are this rank's (harness/checks.py reads them)."""
        return self.model

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, *, last: bool) -> torch.Tensor:
        with self._sync(last), autocast(self.spec, self._device):
            loss = self.model(x, y)
            (loss / self.spec.grad_accum).backward()
        return loss.detach()

    def optimizer_step(self) -> None:
        if self.spec.grad_clip > 0:
            self._clip(self.spec.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Nothing to release: the wrappers' hooks live on the module, dropped with it."""


class DeepSpeedEngine:
    """ZeRO-2/3: DeepSpeed owns accumulation (it divides the loss by k) and the step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def module(self) -> nn.Module:
        return self.engine.module

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, *, last: bool) -> torch.Tensor:
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()  # steps the optimizer only at the accumulation boundary
        return loss.detach()

    def optimizer_step(self) -> None:
        """Nothing to do: the last ``micro_step`` of the step ran the optimizer."""

    def close(self) -> None:
        """DeepSpeed's own teardown (its optimizer's hooks and buffers, ZeRO-3's parameter
        offload), so that a warm rank's next case (harness/pool.py) starts without them; and
        torch.nn.functional.linear put back from DeepSpeed's own copy of it: ZeRO-3 replaces it for
        the life of the process ("This will persist unless manually reset"), and a DDP case after
        it would save what ZeRO-3's linear saves. Likewise DeepSpeed's module-level flag that its
        torch_autocast section was set up (deepspeed/runtime/torch_autocast.py): left True after a
        qlora or autocast ZeRO case, later cases would reduce in each parameter's dtype rather than
        ``communication_data_type`` (runtime/base_optimizer.py)."""
        self.engine.destroy()
        from deepspeed.runtime import torch_autocast
        from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

        original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
        if original is not None:
            torch.nn.functional.linear = original
        torch_autocast.TORCH_AUTOCAST_INITIALIZED, torch_autocast.TORCH_AUTOCAST_DTYPE = False, None


def train_step(engine: TorchEngine | DeepSpeedEngine, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
               *, before_micro_batch: Callable[[], None] | None = None) -> torch.Tensor:
    """One optimizer step of ``engine`` over its grad-accum ``micro_batches`` [(x, y), ...], the last
    one synchronising; the sum of their losses (detached, in fp32 whatever the loss's dtype). The
    measured steps, the traced ones and the memory trackers' all run this, so they train alike.
    ``before_micro_batch`` runs before each (the memory trackers clear their per-module statistics
    there)."""
    total = None
    for m, (x, y) in enumerate(micro_batches):
        if before_micro_batch is not None:
            before_micro_batch()
        loss = engine.micro_step(x, y, last=m == len(micro_batches) - 1)
        total = loss.float() if total is None else total + loss.float()
    engine.optimizer_step()
    return total


def autocast(spec: RunSpec, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast(bf16) where the run computes so (RunSpec.precision "autocast"); the strategies'
    own mixed precision ("native") casts in the wrapper instead."""
    if spec.precision == "autocast":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: nn.Module, spec: RunSpec) -> torch.optim.Optimizer:
    """AdamW, weight decay on parameters of 2+ dims only (nanoGPT ``configure_optimizers``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps)


def common_config(spec: RunSpec) -> dict[str, Any]:
    from harness import strategies

    precision = {"fp32": "fp32", "autocast": "bf16 autocast, fp32 master weights and optimizer state",
                 "native": f"bf16, {strategies.get(spec.strategy).bf16}"}[spec.precision]
    return {
        "strategy": spec.strategy,
        "precision": precision,
        "optimizer": f"torch.optim.AdamW(lr={spec.lr}, betas={list(spec.betas)}, eps={spec.eps}, "
                     f"weight_decay={spec.weight_decay} on 2D+ params)",
        "lr_schedule": "constant",
        "grad_clip_max_norm": spec.grad_clip,
        "grad_accum": spec.grad_accum,
        "grad_sync_during_accumulation": "last micro-batch only",
        "init": "same seed on every rank (identical initial weights)",
        "variant": spec.variant,
    }


def apply_before_wrap(model: nn.Module, spec: RunSpec, config: dict[str, Any]) -> None:
    """Variants applied to the plain model, before any wrapper, the same for every strategy: the
    activation recompute of variant ac, ac-op or ac-every<K> (harness/recompute.py)."""
    from harness.recompute import Recompute, apply

    recompute = Recompute.of(spec.variant_parts())
    apply(model, recompute)
    if recompute.policy != "none":
        config["activation_checkpointing"] = recompute.describe(model.block_class.__name__)


@contextlib.contextmanager
def fsdp2_sync(model: nn.Module, last: bool):
    model.set_requires_gradient_sync(last)
    yield
