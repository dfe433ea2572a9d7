"""Memory by category, measured in the run: PyTorch's own memory trackers on every rank.

After the measured steps (and the traced ones), asked for as instrument ``memory``, each rank runs that many
more optimizer steps under ``torch.distributed._tools``' tracker and records the bytes of each
category at the peak: ``FSDPMemTracker`` for FSDP2 (sharded and unsharded parameters and
gradients, all-gather and reduce-scatter buffers, optimizer state, activations, temporaries),
``MemTracker`` for DDP and DeepSpeed (parameters, gradients, optimizer state, activations,
temporaries, other). These steps are never measured: the tracker sees every op through a
dispatch mode and is slow.

What a tracker sees and what it cannot:
- Tensors made before it starts are seen only when handed to it: the module's parameters and
  buffers and the optimizer's state are. Buffers a wrapper made at start-up and holds itself are
  seen once an op writes them: DDP's reducer buckets (the planner's "grad buckets", a second copy
  of every gradient, made in C++) when backward copies the gradients in (``mul_out``), as
  temporaries; DeepSpeed's reduce buckets are made in the step and seen (the one ``.grad`` views as
  Gradient, whole), but the partitions its ZeRO optimizer made at ``deepspeed.initialize`` are not.
  Those are read off the optimizer itself into ``held_bytes`` (the row's ``held``: harness/strategies.py)
  and handed to the tracker
  before its step (``track_external``: counted once, as Other, wherever the peak falls; AdamW's step
  writes the master in place, which the tracker would otherwise first see there, as optimizer
  state; ``held_in_peak``): ZeRO-2's fp32 master
  partition, ZeRO-3's weight shard, fp32 master and gradient partition (a storage shared by
  two of them is counted once; with fp32 weights DeepSpeed means the master to be the shard, but
  its check compares a torch.device to a str and clones it: measured, 4 B x P_t / N).
- A row with an ``untracked`` reason is not tracked (classic FSDP, fsdp1: its parameters are views of
  a flat parameter, and MemTracker's gradient hooks refuse non-leaf tensors); its rank records it.
  Which tracker runs is the row's ``tracker``: FSDPMemTracker for FSDP2, MemTracker for the rest.
- On CPU it counts bytes of tensors, the same on GPU; a GPU's allocator caches and fragments
  beyond that (the result's peak memory is the allocator's own).

The planner (pytest_llmbench/planner/memory.py) is held to these numbers where the categories mean the same
(tests/harness/test_strategies.py).
"""

from __future__ import annotations

from typing import Any

from harness import strategies

TRACKER_NAMES = {"module": "MemTracker", "fsdp2": "FSDPMemTracker"}  # by the row's tracker (strategies.py)


def record(run: Any) -> dict:
    """``run.steps`` optimizer steps of ``run.engine`` under the tracker; ``{"tracker": name,
    "peak_bytes": {category: bytes}}`` at the largest peak of this rank's device (with DeepSpeed,
    ``"held_bytes"``: what its optimizer made before), or ``{"error": why}`` when the strategy or the
    tracker cannot be tracked (the run goes on). ``run``: the Run of harness/instruments/__init__.py."""
    engine, spec, device = run.engine, run.spec, run.device
    row = strategies.get(spec.strategy)
    if row.untracked:
        return {"error": row.untracked}
    name = TRACKER_NAMES[row.tracker]
    from harness.parallel.engine import train_step

    try:
        made = held_tensors(engine, spec) if row.held else {}
        tracker = tracker_for(engine, spec, [t for tensors in made.values() for t in tensors])
        steps = run.step_batches(run.steps)
        with tracker:
            for micro_batches in steps:  # a module's second forward is refused without the reset
                train_step(engine, micro_batches, before_micro_batch=tracker.reset_mod_stats)
        snapshot = tracker.get_tracker_snapshot("peak")
    except Exception as exc:  # a tracker that fails costs its numbers, never the run's
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"[:500]}
    cats = snapshot.get(device) or next(iter(snapshot.values()), {})
    held = {key: sum(t.numel() * t.element_size() for t in tensors) for key, tensors in made.items()}
    return {"tracker": name, "peak_bytes": {category_name(k): int(v) for k, v in cats.items()},
            **({"held_bytes": held, "held_in_peak": True} if made else {})}


def held_tensors(engine: Any, spec: Any) -> dict[str, list]:
    """The tensors the row's ``held`` names on the engine's ZeRO optimizer, by name; a storage already
    listed under an earlier name is not listed again."""
    import torch

    zero = engine.engine.optimizer  # harness/parallel/engine.py DeepSpeedEngine -> DeepSpeed's own
    seen: set[int] = set()  # storages by their StorageImpl (a fake tensor's data_ptr is 0: planner/memref.py)
    out = {}
    for name, attribute in strategies.get(spec.strategy).held.items():
        value = getattr(zero, attribute)
        tensors = [t for t in (value if isinstance(value, (list, tuple)) else [value])
                   if isinstance(t, torch.Tensor)]
        out[name] = [t for t in tensors if t.untyped_storage()._cdata not in seen]
        seen.update(t.untyped_storage()._cdata for t in tensors)
    return out


def tracker_for(engine: Any, spec: Any, held: list):
    """The tracker for this engine, told of the model, the optimizer and DeepSpeed's ``held``
    partitions, all made before it starts (the partitions then count once, as Other, wherever the
    peak falls: AdamW's step writes the master in place, where the tracker would first see it)."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    row = strategies.get(spec.strategy)
    if row.tracker == "fsdp2":
        return FSDPMemTracker(engine.module, engine.optimizer)
    # DeepSpeed's ZeRO optimizer (harness/parallel/engine.py DeepSpeedEngine) wraps the client AdamW
    optimizer = engine.engine.optimizer.optimizer if row.held else engine.optimizer
    tracker = MemTracker()
    tracker.track_external(engine.module, optimizer if isinstance(optimizer, torch.optim.Optimizer) else None,
                           *held)
    return tracker


def category_name(category: Any) -> str:
    """A tracker's category as a plain name: ``Sharded Param`` -> ``sharded_param``."""
    return str(getattr(category, "value", category)).replace(" ", "_").lower()
