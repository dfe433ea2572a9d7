"""DeepSpeed ZeRO-2 / ZeRO-3 from the config files in harness/configs/; variants: reduce
bucket size, bf16 communication, CPU offload.

The run's own settings are injected so every strategy trains the same way: explicit
integer batch sizes, the same gradient clipping, the precision RunSpec.precision names (DeepSpeed's
``bf16`` section; ``torch_autocast`` with fp32 master weights for the variant autocast; or plain
fp32) and a client
``torch.optim.AdamW`` (which also avoids DeepSpeed JIT-building FusedAdam, ~86 s on CPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness import compiled, strategies
from harness.parallel.engine import DeepSpeedEngine, apply_before_wrap, common_config, make_optimizer
from harness.spec import RunSpec

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def build(model: nn.Module, spec: RunSpec, device: torch.device) -> tuple[DeepSpeedEngine, dict[str, Any]]:
    config = common_config(spec)
    apply_before_wrap(model, spec, config)
    engine = DeepSpeedEngine(apply_deepspeed(model, make_optimizer(model, spec), spec=spec))
    if compiled.wanted(spec):
        engine.engine.compile()  # DeepSpeed's own: DeepSpeedEngine.compile(), inductor backend
        config["compile"] = "DeepSpeedEngine.compile() (inductor)"
    config.update(wrapper=f"deepspeed.initialize ZeRO stage {zero_stage(spec)}",
                  grad_sync_during_accumulation="every micro-batch (ZeRO reduces each backward)",
                  deepspeed_config=deepspeed_config(spec))
    return engine, config


def zero_stage(spec: RunSpec) -> int:
    """The ZeRO stage of the strategy's row (``engine_options["zero_stage"]``)."""
    return int(strategies.get(spec.strategy).engine_options["zero_stage"])


def deepspeed_config(spec: RunSpec) -> dict[str, Any]:
    """The config file of the strategy's ZeRO stage with the run's settings and variant injected."""
    config = json.loads((CONFIG_DIR / f"zero{zero_stage(spec)}.json").read_text())
    config.update(
        train_micro_batch_size_per_gpu=spec.micro_batch,
        gradient_accumulation_steps=spec.grad_accum,
        train_batch_size=spec.micro_batch * spec.grad_accum * spec.world_size,
        gradient_clipping=float(spec.grad_clip),
    )
    if spec.precision == "native":  # DeepSpeed's own: bf16 parameters, fp32 master partition
        config["bf16"] = {"enabled": True}
    elif spec.precision == "autocast":
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    parts, zero = spec.variant_parts(), config["zero_optimization"]
    if parts.get("bucket"):  # MiB of fp32 gradients, as DDP's bucket_cap_mb; DeepSpeed counts elements
        zero["reduce_bucket_size"] = parts["bucket"] * 2**20 // 4
    if "bf16-reduce" in parts:
        config["communication_data_type"] = "bf16"
    if "offload" in parts:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if zero["stage"] == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        # keep the client torch.optim.AdamW every strategy uses (DeepSpeedCPUAdam would be
        # another optimizer implementation and a JIT build)
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def apply_deepspeed(model: nn.Module, optimizer: torch.optim.Optimizer, *, spec: RunSpec):
    """``deepspeed.initialize`` on an already initialised torch process group."""
    if spec.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if spec.device == "cpu":
        _skip_shm_comm_build()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=deepspeed_config(spec))
    return engine


def _skip_shm_comm_build() -> None:
    """Avoid the ~56 s JIT build of DeepSpeed's CPU shared-memory comm op.

    Collectives then go through the torch process group (gloo), as for the other
    strategies. ``sys.modules`` is needed: ``deepspeed.comm.torch`` as an attribute is
    shadowed by the real torch module, so patching that name silently does nothing.
    """
    import deepspeed.comm.torch  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
