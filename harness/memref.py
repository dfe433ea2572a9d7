"""References for memory at scale, computed without the hardware: PyTorch's own memory trackers
running the real architecture under ``FakeTensorMode``, and DeepSpeed's own estimators.

    fsdp_peak(spec)         FSDP2 exactly as harness/parallel/fsdp.py wraps it, at spec.world_size,
                            in one CPU process: ``FSDPMemTracker`` over two optimizer steps (the
                            second one, with optimizer state, is the one reported) on the built-in
                            ``"fake"`` process group. Bytes by category at the peak.
    activation_peak(spec)   the plain model (no wrapper) under ``MemTracker``: activations and
                            temporaries (activation + temp) at the peak of one micro-batch. This is what
                            the planner (pytest_llmbench/plan.py) adds to its state terms.
    deepspeed_estimates()   ``estimate_zero2_model_states_mem_needs`` and
                            ``estimate_zero3_model_states_mem_needs`` (GPU bytes, no offload).

Fake tensors hold no storage, so a 7B model at N = 256 costs seconds, not GPUs. What they measure
is what the CPU kernels would allocate (flash attention for CPU included); a CUDA run can differ
in temporaries. Findings that shaped this code: the model must be built inside the fake mode
(moving a built model into it fails), AdamW runs with ``foreach=False`` (the fused temporaries are
never freed under fake mode and over-count optimizer state 13.5x), and the device mesh is made
outside the fake mode (``init_device_mesh`` reads real rank tensors).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness.spec import RunSpec

DEVICE = torch.device("cpu")


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """The built-in ``"fake"`` process group at ``world_size`` (this process is rank 0)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model(spec: RunSpec) -> torch.nn.Module:
    from harness.model import build_model

    return build_model(spec, DEVICE)


def _steps(engine, spec: RunSpec, tracker) -> None:
    """Two optimizer steps of ``spec.grad_accum`` micro-batches. The tracker's peak is the larger
    of the two, which is the second one's (optimizer state allocated). Its per-module statistics
    are cleared before each forward: FSDPMemTracker refuses a module's second forward otherwise
    (the global peak is kept)."""
    from harness.parallel.engine import train_step

    for _ in range(2):
        inputs = [torch.randint(0, spec.vocab_size, (spec.micro_batch, spec.seq_len))
                  for _ in range(spec.grad_accum)]
        train_step(engine, [(x, x.clone()) for x in inputs], before_micro_batch=tracker.reset_mod_stats)


def _no_foreach(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group["foreach"] = False


def _named(cats: dict) -> dict[str, int]:
    """A tracker's snapshot of one device with its category enums as names: ``sharded_param``..."""
    from harness.memtrack import category_name

    return {category_name(k): int(v) for k, v in cats.items()}


def _categories(tracker) -> dict[str, int]:
    snapshot = tracker.get_tracker_snapshot("peak")
    return _named(snapshot.get(DEVICE) or next(iter(snapshot.values())))


def fsdp_peak(spec: RunSpec) -> dict[str, int]:
    """FSDPMemTracker's bytes by category at the peak of a steady step of FSDP2 (``spec.strategy``
    must be fsdp) at ``spec.world_size``: sharded_param, unsharded_param, sharded_grad,
    unsharded_grad, activation, temp, all_gather, reduce_scatter, optstate, buffer, inputs, total."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from harness.parallel import fsdp

    if spec.strategy != "fsdp":
        raise ValueError(f"fsdp_peak: strategy {spec.strategy!r}; FSDPMemTracker tracks FSDP2 (fsdp) only")
    real_mesh = fsdp.init_device_mesh

    def mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return real_mesh(*args, **kwargs)

    with fake_world(spec.world_size), FakeTensorMode():
        fsdp.init_device_mesh = mesh
        try:
            engine, _ = fsdp.build(_model(spec), spec, DEVICE)
        finally:
            fsdp.init_device_mesh = real_mesh
        _no_foreach(engine.optimizer)
        tracker = FSDPMemTracker(engine.model, engine.optimizer)
        with tracker:
            _steps(engine, spec, tracker)
        return _categories(tracker)


def _plain_engine(spec: RunSpec):
    """One rank's plain model and optimizer with the harness's engine semantics, no wrapper."""
    from harness.parallel.engine import TorchEngine, apply_before_wrap, make_optimizer

    model = _model(spec)
    apply_before_wrap(model, spec, {})
    return TorchEngine(model, make_optimizer(model, spec), spec=spec, device=DEVICE,
                       sync=lambda last: contextlib.nullcontext(), clip=lambda c: None)


def activation_peak(spec: RunSpec) -> int:
    """Bytes of activations and temporaries (MemTracker activation + temp) at the peak of a steady step
    of the plain model at ``spec.micro_batch`` x ``spec.seq_len`` (grad_accum 1, one rank)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    spec = spec.replace(grad_accum=1, strategy="ddp", world_size=1)
    with FakeTensorMode():
        engine = _plain_engine(spec)
        _no_foreach(engine.optimizer)
        tracker = MemTracker()
        tracker.track_external(engine.model, engine.optimizer)
        with tracker:
            _steps(engine, spec, tracker)
        # Not the global peak: unsharded, that is the optimizer step, when activations are gone.
        # The model's own peaks in forward and backward (its last micro-batch) are where they are.
        stats = tracker.memory_tracking[engine.model]
        peaks = [snaps for state, snaps in stats.snapshots.items()
                 if "peak" in str(getattr(state, "value", state)).lower()]
        named = [_named(cats) for snaps in peaks for snap in snaps for cats in snap.values()]
        return max(c.get("activation", 0) + c.get("temp", 0) for c in named)


def activation_peak_by_depth(spec: RunSpec, depths: tuple[int, int] = (2, 4)) -> int:
    """``activation_peak`` at the spec's depth, extrapolated linearly from two shallow copies of
    the model (what a block adds is the same for every block; the head's temporaries are not).
    The model at full depth gives the same bytes (tests/unit/test_plan.py) in a fraction of the
    time."""
    a, b = depths
    if spec.n_layer <= b:
        return activation_peak(spec)
    at_a, at_b = activation_peak(spec.replace(n_layer=a)), activation_peak(spec.replace(n_layer=b))
    return int(at_a + (at_b - at_a) * (spec.n_layer - a) / (b - a))


def deepspeed_estimates(total_params: int, largest_layer_params: int, world_size: int) -> dict[str, int]:
    """DeepSpeed's own estimates of GPU bytes for model states (no offload) at ``world_size``
    devices: ``zero2`` = 2P + 18P/N, ``zero3`` = 4 x largest layer + 18P/N (16-bit training)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, zero2 = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=world_size,
                                                      cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
                                                         num_gpus_per_node=world_size, cpu_offload=False,
                                                         cpu_offload_params=False)
    return {"zero2": int(zero2), "zero3": int(zero3)}
