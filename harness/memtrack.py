"""Memory by category, measured in the run: PyTorch's own memory trackers on every rank.

After the measured steps (and the traced ones), with ``spec.memory_steps``, each rank runs that many
more optimizer steps under ``torch.distributed._tools``' tracker and records the bytes of each
category at the peak: ``FSDPMemTracker`` for FSDP2 (sharded and unsharded parameters and
gradients, all-gather and reduce-scatter buffers, optimizer state, activations, temporaries),
``MemTracker`` for DDP and DeepSpeed (parameters, gradients, optimizer state, activations,
temporaries, other). These steps are never measured: the tracker sees every op through a
dispatch mode and is slow.

What a tracker sees and what it cannot:
- Tensors made before it starts are seen only when handed to it: the module's parameters and
  buffers and the optimizer's state are. Buffers a wrapper made at start-up and holds itself are
  not: DDP's reducer buckets (the planner's "grad buckets", a second copy of every gradient) live in
  C++; DeepSpeed's fp32 partitions and reduce buckets are seen once a step touches them (a bucket
  that ``.grad`` views is counted as Gradient, whole).
- Classic FSDP (fsdp1) is not tracked: its parameters are views of a flat parameter, and
  MemTracker's gradient hooks refuse non-leaf tensors; its rank records that reason.
- On CPU it counts bytes of tensors, the same on GPU; a GPU's allocator caches and fragments
  beyond that (the result's peak memory is the allocator's own).

The planner (pytest_llmbench/plan.py) is held to these numbers where the categories mean the same
(tests/harness/test_strategies.py).
"""

from __future__ import annotations

from typing import Any

UNTRACKED = {"fsdp1": "classic FSDP is not tracked: its parameters are views of a flat parameter, and "
                      "MemTracker's gradient hooks refuse non-leaf tensors"}


def record(engine: Any, batches: list, spec: Any, device: Any) -> dict:
    """``spec.memory_steps`` optimizer steps of ``engine`` under the tracker; ``{"tracker": name,
    "peak_bytes": {category: bytes}}`` at the largest peak of this rank's device, or ``{"error":
    why}`` when the strategy or the tracker cannot be tracked (the run goes on)."""
    if spec.strategy in UNTRACKED:
        return {"error": UNTRACKED[spec.strategy]}
    name = "FSDPMemTracker" if spec.strategy == "fsdp" else "MemTracker"
    try:
        tracker = _tracker(engine, spec)
        steps = [batches[i % len(batches)] for i in range(spec.memory_steps)]
        with tracker:
            for micro_batches in steps:
                for m, (x, y) in enumerate(micro_batches):
                    tracker.reset_mod_stats()  # a module's second forward is refused otherwise
                    engine.micro_step(x, y, last=m == len(micro_batches) - 1)
                engine.optimizer_step()
        snapshot = tracker.get_tracker_snapshot("peak")
    except Exception as exc:  # a tracker that fails costs its numbers, never the run's
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"[:500]}
    cats = snapshot.get(device) or next(iter(snapshot.values()), {})
    return {"tracker": name, "peak_bytes": {_name(k): int(v) for k, v in cats.items()}}


def _tracker(engine: Any, spec: Any):
    """The tracker for this engine, told of the model and the optimizer made before it starts."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    if spec.strategy == "fsdp":
        return FSDPMemTracker(engine.module, engine.optimizer)
    optimizer = getattr(engine, "optimizer", None) or engine.engine.optimizer
    optimizer = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's ZeRO wraps the client AdamW
    tracker = MemTracker()
    tracker.track_external(engine.module, optimizer if isinstance(optimizer, torch.optim.Optimizer) else None)
    return tracker


def _name(category: Any) -> str:
    """A tracker's category as a plain name: ``Sharded Param`` -> ``sharded_param``."""
    return str(getattr(category, "value", category)).replace(" ", "_").lower()
