"""``build_engine``: look the strategy up in the strategy table and let its engine module build
the engine.

Each engine module (ddp, fsdp, fsdp1, deepspeed, or a plugin's) has ``build(model, spec, device)
-> (engine, config)``: it wraps the model, applies the variants it supports and records in
``config`` exactly what it used. What they share is in engine.py. Which variants a strategy
supports is its row in harness/strategies.py.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from harness import strategies
from harness.parallel.engine import DeepSpeedEngine, TorchEngine, make_optimizer  # noqa: F401
from harness.spec import RunSpec, SpecError


def build_engine(model: nn.Module, spec: RunSpec, device: Any):
    """(engine, config): the wrapped model and a record of what the strategy really used."""
    problem = spec.problem()
    if problem:
        raise SpecError(problem)
    module = importlib.import_module(strategies.get(spec.strategy).engine)
    return module.build(model, spec, device)
