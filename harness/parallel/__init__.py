"""``build_engine``: look the strategy up and let its module build the engine.

Each strategy module (ddp, fsdp, fsdp1, deepspeed) has ``build(model, spec, device) ->
(engine, config)``: it wraps the model, applies the variants it supports and records in
``config`` exactly what it used. What they share is in engine.py. A new variant touches the
modules of the strategies it applies to (and ``harness.spec.VARIANT_STRATEGIES``).
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from harness.parallel.engine import DeepSpeedEngine, TorchEngine, make_optimizer  # noqa: F401
from harness.spec import RunSpec, SpecError

MODULES = {"ddp": "ddp", "fsdp": "fsdp", "fsdp1": "fsdp1", "zero2": "deepspeed", "zero3": "deepspeed"}


def build_engine(model: nn.Module, spec: RunSpec, device: Any):
    """(engine, config): the wrapped model and a record of what the strategy really used."""
    problem = spec.problem()
    if problem:
        raise SpecError(problem)
    module = importlib.import_module(f"harness.parallel.{MODULES[spec.strategy]}")
    return module.build(model, spec, device)
