"""PyTorch DistributedDataParallel, and its variants: bucket size, PowerSGD, bf16 reduction."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from harness import compiled
from harness.parallel.engine import TorchEngine, apply_before_wrap, common_config, make_optimizer
from harness.spec import RunSpec

DEFAULT_BUCKET_MB = 25  # DDP's own default


def build(model: nn.Module, spec: RunSpec, device: torch.device) -> tuple[TorchEngine, dict[str, Any]]:
    parts, config = spec.variant_parts(), common_config(spec)
    apply_before_wrap(model, spec, config)
    bucket = parts.get("bucket") or DEFAULT_BUCKET_MB
    device_ids = [device.index] if device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket)
    config.update(wrapper="DistributedDataParallel", bucket_cap_mb=bucket,
                  comm_hook=register_hook(wrapped, spec, parts))
    runs = compiled.whole(wrapped) if compiled.wanted(spec) else wrapped  # compiled DDP
    if runs is not wrapped:
        config["compile"] = "torch.compile(DistributedDataParallel(model)): compiled DDP, DDPOptimizer"
    engine = TorchEngine(runs, make_optimizer(wrapped, spec), spec=spec, device=device,
                         sync=lambda last: contextlib.nullcontext() if last else wrapped.no_sync(),
                         clip=lambda c: nn.utils.clip_grad_norm_(wrapped.parameters(), c))
    return engine, config


def register_hook(model: DistributedDataParallel, spec: RunSpec, parts: dict[str, int | None]) -> str:
    """The gradient communication hook of the variant, and what it is, in words."""
    if "powersgd" in parts:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        # PowerSGD's default start_powerSGD_iter (1000) would never compress in a benchmark:
        # start on the last warm-up step (iterations count optimizer steps here, since gradients
        # are only synchronised on the last micro-batch; the 0-based iteration warmup_steps - 1),
        # so that the measured steps all compress and the recorded traffic is compressed; 2 is
        # the least it accepts with error feedback.
        start = max(2, spec.warmup_steps - 1)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=parts["powersgd"],
                                            start_powerSGD_iter=start, use_error_feedback=True,
                                            warm_start=True, random_seed=spec.seed)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return (f"powerSGD_hook(matrix_approximation_rank={parts['powersgd']}, start_powerSGD_iter={start}, "
                f"use_error_feedback=True, warm_start=True)")
    if "bf16-reduce" in parts:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return "bf16_compress_hook (gradients all-reduced in bf16)"
    return "none (fp32 all-reduce)"
