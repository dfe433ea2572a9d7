"""One entry point, ``build_engine``: wrap the model for a strategy and say what was used.

An engine runs a micro-batch (``micro_step``) and an optimizer step (``optimizer_step``)
with the same semantics for every strategy:

- loss of a step = mean over its grad-accum micro-batches (each backward sees loss / k);
- gradients are synchronised only on the last micro-batch where the strategy allows it
  (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``, FSDP1 ``no_sync``); ZeRO-2/3
  reduce on every micro-batch by design, and the result records that;
- torch.optim.AdamW with the spec's lr/betas/eps/weight decay, decay on matrices only;
- global gradient-norm clipping at ``spec.grad_clip``;
- bf16 autocast with fp32 master weights when ``spec.dtype == "bf16"``, else fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from harness.model import Block
from harness.spec import RunSpec


class TorchEngine:
    """DDP, FSDP2 and FSDP1: a torch module plus a torch optimizer."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, spec: RunSpec,
                 sync: Callable[[bool], contextlib.AbstractContextManager],
                 clip: Callable[[float], Any], device: torch.device) -> None:
        self.model, self.optimizer, self.spec = model, optimizer, spec
        self._sync, self._clip, self._device = sync, clip, device

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


class DeepSpeedEngine:
    """ZeRO-2/3: DeepSpeed owns accumulation (it divides the loss by k) and the step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, *, last: bool) -> torch.Tensor:
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()  # steps the optimizer only at the accumulation boundary
        return loss.detach()

    def optimizer_step(self) -> None:
        """Nothing to do: the last ``micro_step`` of the step ran the optimizer."""


def autocast(spec: RunSpec, device: torch.device) -> contextlib.AbstractContextManager:
    if spec.dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: nn.Module, spec: RunSpec) -> torch.optim.Optimizer:
    """AdamW, weight decay on parameters of 2+ dims only (nanoGPT ``configure_optimizers``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps)


def build_engine(model: nn.Module, spec: RunSpec, device: torch.device):
    """(engine, config): the wrapped model and a record of what the strategy really used."""
    config = common_config(spec)
    if spec.strategy == "ddp":
        from harness.parallel.ddp import apply_ddp

        wrapped = apply_ddp(model, device=device)
        engine = TorchEngine(wrapped, make_optimizer(wrapped, spec), spec=spec, device=device,
                             sync=lambda last: contextlib.nullcontext() if last else wrapped.no_sync(),
                             clip=lambda c: nn.utils.clip_grad_norm_(wrapped.parameters(), c))
        config.update(wrapper="DistributedDataParallel", bucket_cap_mb=25)
    elif spec.strategy == "fsdp":
        from harness.parallel.fsdp import apply_fsdp

        wrapped = apply_fsdp(model, device=device, world_size=spec.world_size)
        engine = TorchEngine(wrapped, make_optimizer(wrapped, spec), spec=spec, device=device,
                             sync=lambda last: _fsdp2_sync(wrapped, last),
                             clip=lambda c: nn.utils.clip_grad_norm_(wrapped.parameters(), c))
        config.update(wrapper="FSDP2 fully_shard", wrap_policy="each Block, then root",
                      reshard_after_forward=True, param_dtype="fp32")
    elif spec.strategy == "fsdp1":
        from harness.parallel.fsdp1 import apply_fsdp1

        wrapped = apply_fsdp1(model, device=device, block_cls=Block)
        engine = TorchEngine(wrapped, make_optimizer(wrapped, spec), spec=spec, device=device,
                             sync=lambda last: contextlib.nullcontext() if last else wrapped.no_sync(),
                             clip=wrapped.clip_grad_norm_)
        config.update(wrapper="FullyShardedDataParallel (FSDP1)", wrap_policy="ModuleWrapPolicy({Block})",
                      sharding_strategy="FULL_SHARD", use_orig_params=True)
    else:
        from harness.parallel.deepspeed import apply_deepspeed, deepspeed_config

        engine = DeepSpeedEngine(apply_deepspeed(model, make_optimizer(model, spec), spec=spec))
        config.update(wrapper=f"deepspeed.initialize ZeRO stage {spec.strategy[-1]}",
                      grad_sync_during_accumulation="every micro-batch (ZeRO reduces each backward)",
                      deepspeed_config=deepspeed_config(spec))
    return engine, config


def common_config(spec: RunSpec) -> dict[str, Any]:
    precision = ("bf16 autocast, fp32 master weights and optimizer state" if spec.dtype == "bf16"
                 else "fp32")
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
    }


@contextlib.contextmanager
def _fsdp2_sync(model: nn.Module, last: bool):
    model.set_requires_gradient_sync(last)
    yield
