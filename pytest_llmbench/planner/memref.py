"""References for memory at scale, computed without the hardware: PyTorch's own memory trackers
running the real architecture under ``FakeTensorMode``, and DeepSpeed's own estimators.

    fsdp_peak(spec)         FSDP2 exactly as harness/parallel/fsdp.py wraps it, at spec.world_size,
                            in one CPU process: ``FSDPMemTracker`` over a steady optimizer step (after
                            one untracked step: optimizer state exists, DTensor's first-run fake
                            copies are gone) on the built-in ``"fake"`` process group. Bytes by
                            category at the peak.
    deepspeed_peak(spec)    DeepSpeed's ZeRO-2/3 engine exactly as harness/parallel/deepspeed.py
                            builds it, at spec.world_size as its fullest rank, on the same fake
                            group: ``MemTracker``'s bytes by category at the peak and as AdamW
                            starts its step. It equals the real engine's 2-rank runs byte for byte
                            in states (tests/harness/test_memref.py).
    activation_peak(spec)   the plain model (no wrapper) under ``MemTracker``: activations and
                            temporaries (activation + temp) at the peak of one micro-batch. This is what
                            the planner (pytest_llmbench/planner/memory.py) adds to its state terms.
    deepspeed_estimates()   ``estimate_zero2_model_states_mem_needs`` and
                            ``estimate_zero3_model_states_mem_needs`` (GPU bytes, no offload).

Fake tensors hold no storage, so a 7B model at N = 256 costs seconds, not GPUs. What they measure
is what the CPU kernels would allocate (flash attention for CPU included); a CUDA run can differ
in temporaries. Findings that shaped this code: the model must be built inside the fake mode
(moving a built model into it fails), AdamW runs with ``foreach=False`` (the fused temporaries are
never freed under fake mode and over-count optimizer state 13.5x), and the device mesh is made
outside the fake mode (``init_device_mesh`` reads real rank tensors); DeepSpeed needs its device
move skipped and its value checks answered (``deepspeed_peak``), and its own teardown between runs.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from unittest import mock

import torch

from harness import recompute, strategies
from harness.spec import RunSpec

DEVICE = torch.device("cpu")


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """The built-in ``"fake"`` process group at ``world_size``, this process as ``rank``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        if dist.is_initialized():  # DeepSpeed's teardown destroys it too (deepspeed_peak)
            dist.destroy_process_group()


@contextlib.contextmanager
def as_real_inputs() -> Iterator[None]:
    """Answer what transformers asks of an input's values as the harness's real inputs answer it.
    Fake tensors hold no values, so transformers' ``find_packed_sequence_indices`` cannot tell that
    the position ids (0..T-1 in every row: CausalLM passes none, so the model counts them) are one
    sequence per row, treats the batch as packed, and builds an explicit mask: SDPA then takes the
    masked path, ``repeat_kv`` copies k and v to every head, and the activations come out larger
    than any real run's (Mistral-7B, seq 2048: 2.12 against 1.99 GiB at two layers, +1.0 GiB at 32).
    A real run's answer is None (no packed sequences), given here."""
    try:
        from transformers import masking_utils
    except ImportError:  # GPT models only: nothing to answer
        yield
        return
    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def _model(spec: RunSpec) -> torch.nn.Module:
    from harness.model import build_model

    return build_model(spec, DEVICE)


def _batches(spec: RunSpec) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Two optimizer steps' micro-batches, made before the tracker starts (as a run's data loader
    makes them before its step)."""
    steps = []
    for _ in range(2):
        inputs = [torch.randint(0, spec.vocab_size, (spec.micro_batch, spec.seq_len))
                  for _ in range(spec.grad_accum)]
        steps.append([(x, x.clone()) for x in inputs])
    return steps


def _steps(engine, batches: list, tracker) -> None:
    """The optimizer steps of ``batches`` (from ``_batches``), under ``tracker`` (None: untracked).
    Over two tracked steps the tracker's peak is the second one's (optimizer state allocated). Its
    per-module statistics are cleared before each forward: FSDPMemTracker refuses a module's second
    forward otherwise (the global peak is kept)."""
    from harness.parallel.engine import train_step

    for micro_batches in batches:
        train_step(engine, micro_batches, before_micro_batch=tracker.reset_mod_stats if tracker else None)


def _no_foreach(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group["foreach"] = False


def _named(cats: dict) -> dict[str, int]:
    """A tracker's snapshot of one device with its category enums as names: ``sharded_param``..."""
    from harness.instruments.memory import category_name

    return {category_name(k): int(v) for k, v in cats.items()}


def _categories(tracker) -> dict[str, int]:
    snapshot = tracker.get_tracker_snapshot("peak")
    return _named(snapshot.get(DEVICE) or next(iter(snapshot.values())))


def fsdp_peak(spec: RunSpec, row: strategies.Strategy) -> dict[str, int]:
    """FSDPMemTracker's bytes by category at the peak of a steady step of FSDP2 (``row``: the spec
    strategy's row, whose tracker must be fsdp2) at ``spec.world_size``: sharded_param,
    unsharded_param, sharded_grad, unsharded_grad, activation, temp, all_gather, reduce_scatter,
    optstate, buffer, inputs, total."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from harness.parallel import fsdp

    if row.tracker != "fsdp2":
        raise ValueError(f"fsdp_peak: strategy {spec.strategy!r}; FSDPMemTracker tracks FSDP2 only (a row "
                         f"whose tracker is fsdp2)")
    real_mesh = fsdp.init_device_mesh

    def mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return real_mesh(*args, **kwargs)

    with fake_world(spec.world_size), FakeTensorMode(), as_real_inputs():
        fsdp.init_device_mesh = mesh
        try:
            engine, _ = fsdp.build(_model(spec), spec, DEVICE)
        finally:
            fsdp.init_device_mesh = real_mesh
        _no_foreach(engine.optimizer)
        first, second = _batches(spec)
        # one step untracked, then a steady one tracked: the first time each op runs under the fake
        # mode, DTensor's sharding propagation builds global-shape fake copies of its inputs (in
        # clip_grad_norm_: every fp32 gradient, 4 B x P, counted as activation), cached after
        _steps(engine, [first], None)
        tracker = FSDPMemTracker(engine.model, engine.optimizer)  # AdamW's state exists: tracked as such
        with tracker:
            _steps(engine, [second], tracker)
        return _categories(tracker)


def deepspeed_peak(spec: RunSpec, row: strategies.Strategy, rank: int | None = None) -> dict[str, int]:
    """MemTracker's bytes by category at the peak of a steady step of DeepSpeed ZeRO-2/3 exactly as
    harness/parallel/deepspeed.py builds it (its config, the client AdamW), at ``spec.world_size``
    on the ``"fake"`` process group as ``rank`` (default: ZeRO-2's fullest, whose gradient buffer
    holds the most straddling tensors; rank 0 for ZeRO-3). What DeepSpeed's optimizer made at
    initialize is handed to the tracker as harness/instruments/memory.py does in real runs (in "other") and
    listed as ``held:<name>``; ``step:<category>`` is what is alive as the client AdamW starts a
    step, at the fullest such moment (DeepSpeed steps it group by group): the model states of the
    step at once (weights, master, moments, the gradient buffer and the group's flat fp32 copy of
    its gradients), activations gone, before AdamW's own temporaries. Keys: parameter, buffer,
    gradient, activation, temp, optstate, other, total, held:<name>, step:<category>.

    DeepSpeed's engine runs unchanged but for what a fake tensor cannot answer: its device move
    (``module.to``: a no-op on CPU; under FakeTensorMode it swaps tensors, which fake ones refuse)
    and the checks that read a value (overflow, a finite gradient norm, the same module order on
    every rank), which it skips (they allocate a few scalars)."""
    cpu_deepspeed()
    from deepspeed import comm as deepspeed_comm
    from torch._subclasses.fake_tensor import FakeTensorMode

    from harness.instruments import memory as instrument
    from harness.parallel import deepspeed
    from harness.shapes import optimizer_groups, zero_touched_by_rank

    if not row.held:
        raise ValueError(f"deepspeed_peak: strategy {spec.strategy!r} holds no ZeRO optimizer state (its "
                         f"row's held is empty)")
    if rank is None:  # ZeRO-2's ranks differ (the largest partition); ZeRO-3 shards every tensor evenly
        touched = zero_touched_by_rank(optimizer_groups(spec), spec.world_size)
        rank = touched.index(max(touched)) if row.engine_options.get("zero_stage") == 2 else 0
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(spec.world_size)}  # as torchrun
    with mock.patch.dict(os.environ, env), fake_world(spec.world_size, rank), FakeTensorMode(), \
            as_real_inputs(), _deepspeed_without_value_checks():
        model = _model(spec)
        model.to = lambda *args, **kwargs: model
        engine, _ = deepspeed.build(model, spec, DEVICE)
        _no_foreach(engine.engine.optimizer.optimizer)
        first, second = _batches(spec)
        # as harness/instruments/memory.py tracks a real run: after a step (AdamW's state exists), one step
        _steps(engine, [first], None)
        held = instrument.held_tensors(engine, spec)
        tracker = instrument.tracker_for(engine, spec, [t for tensors in held.values() for t in tensors])
        at_step: list[dict] = []  # what is alive as the client AdamW starts a step
        engine.engine.optimizer.optimizer.register_step_pre_hook(
            lambda *_: at_step.append(tracker.get_tracker_snapshot("current")))
        with tracker:
            _steps(engine, [second], tracker)
        out = _categories(tracker)
        # DeepSpeed steps AdamW group by group, each with its own flat fp32 copy: the fullest is the one
        step = max((_named(next(iter(snap.values()))) for snap in at_step), key=lambda c: c["total"])
        out.update({f"step:{category}": value for category, value in step.items()})
        out.update({f"held:{name}": sum(t.numel() * t.element_size() for t in tensors)
                    for name, tensors in held.items()})
        engine.close()  # as a run's case ends (ZeRO-3's replacement of torch's linear undone)
        deepspeed_comm.destroy_process_group()  # and DeepSpeed's own references to the world's groups
        return out


@contextlib.contextmanager
def _deepspeed_without_value_checks() -> Iterator[None]:
    """DeepSpeed's checks that read a tensor's value (``.item()``, ``bool``), which a fake tensor
    has not, answered as a healthy run answers them: no overflow, a finite norm, the same order."""
    from deepspeed.runtime.zero import partitioned_param_coordinator, stage3, stage_1_and_2

    patches = [(stage_1_and_2.DeepSpeedZeroOptimizer, "has_overflow", lambda *a, **k: False),
               (stage3.DeepSpeedZeroOptimizer_Stage3, "has_overflow", lambda *a, **k: False),
               (stage_1_and_2, "is_invalid_grad_norm", lambda norm: False),
               (stage3, "is_invalid_grad_norm", lambda norm: False),
               (partitioned_param_coordinator, "assert_ints_same_as_other_ranks", lambda ints: None)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _plain_engine(spec: RunSpec):
    """One rank's plain model and optimizer with the harness's engine semantics, no wrapper."""
    from harness.parallel.engine import TorchEngine, apply_before_wrap, make_optimizer

    model = _model(spec)
    apply_before_wrap(model, spec, {})
    return TorchEngine(model, make_optimizer(model, spec), spec=spec, device=DEVICE,
                       sync=lambda last: contextlib.nullcontext(), clip=lambda c: None)


def activation_peak(spec: RunSpec) -> int:
    """Bytes of activations and temporaries (MemTracker activation + temp) at the peak of a steady step
    of the plain model at ``spec.micro_batch`` x ``spec.seq_len`` (grad_accum 1, one rank), computing
    as ``spec``'s strategy does (RunSpec.precision): fp32; bf16 autocast over fp32 parameters; or, for
    the strategies' own bf16 ("native"), parameters in bf16, as DeepSpeed's bf16 section and FSDP2's
    param_dtype cast them (buffers stay fp32)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    native = spec.precision == "native"
    spec = spec.replace(grad_accum=1, strategy=strategies.REPLICA, world_size=1,
                        **({"dtype": "fp32"} if native else {}))
    with FakeTensorMode(), as_real_inputs():
        engine = _plain_engine(spec)
        if native:
            for param in engine.model.parameters():
                param.data = param.data.to(torch.bfloat16)
        _no_foreach(engine.optimizer)
        tracker = MemTracker()
        tracker.track_external(engine.model, engine.optimizer)
        batches = _batches(spec)
        with tracker:
            _steps(engine, batches, tracker)
        # Not the global peak: unsharded, that is the optimizer step, when activations are gone.
        # The model's own peaks in forward and backward (its last micro-batch) are where they are.
        stats = tracker.memory_tracking[engine.model]
        peaks = [snaps for state, snaps in stats.snapshots.items()
                 if "peak" in str(getattr(state, "value", state)).lower()]
        named = [_named(cats) for snaps in peaks for snap in snaps for cats in snap.values()]
        return max(c.get("activation", 0) + c.get("temp", 0) for c in named)


def activation_peak_by_depth(spec: RunSpec, first: int = 2) -> int:
    """``activation_peak`` at the spec's depth, extrapolated linearly from shallow copies of the model
    once what a block adds has settled: three depths d, d + k, d + 2k, and when their two steps agree
    (within 2%, neither negative) the line through the last two; else k blocks deeper. k is 2, or
    the least multiple of ``ac-every<K>``'s K that is even: blocks that differ in turn (every second one
    checkpointed) add the same over k. At shallow depths the peak can sit elsewhere (the head's
    temporaries, one recomputed block), and what a block adds there is not what it adds deeper:
    MPT-30B at seq 2048 adds 0.37 GiB a block from depth 2 to 4 and 0.44 GiB from then on; with every
    block recomputed at seq 8192 the peak falls from depth 2 to 3, and the line through depths 2 and 4
    said -7.6 GiB at 48 blocks. A model whose steps never agree is measured at full depth. The model at
    full depth gives the same bytes (tests/harness/test_memref.py) in a fraction of the time."""
    every = recompute.Recompute.of(spec.variant_parts()).every
    k = math.lcm(every, 2)
    peaks: dict[int, int] = {}

    def at(depth: int) -> int:
        if depth not in peaks:
            peaks[depth] = activation_peak(spec.replace(n_layer=depth))
        return peaks[depth]

    depth = first
    while depth + 2 * k < spec.n_layer:
        steps = at(depth + k) - at(depth), at(depth + 2 * k) - at(depth + k)
        if steps[1] >= 0 and abs(steps[0] - steps[1]) <= 0.02 * max(steps[0], steps[1]):
            return int(at(depth + 2 * k) + steps[1] * (spec.n_layer - depth - 2 * k) / k)
        depth += k
    return activation_peak(spec)


def deepspeed_estimates(total_params: int, largest_layer_params: int, world_size: int) -> dict[str, int]:
    """DeepSpeed's own estimates of GPU bytes for model states (no offload) at ``world_size``
    devices: ``zero2`` = 2P + 18P/N, ``zero3`` = 4 x largest layer + 18P/N (16-bit training)."""
    cpu_deepspeed()
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, zero2 = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=world_size,
                                                      cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
                                                         num_gpus_per_node=world_size, cpu_offload=False,
                                                         cpu_offload_params=False)
    return {"zero2": int(zero2), "zero3": int(zero3)}


def cpu_deepspeed() -> None:
    """DeepSpeed on its CPU accelerator, chosen before its first import: DeepSpeed fixes the
    accelerator when it is imported (deepspeed/accelerator/real_accelerator.py, from DS_ACCELERATOR,
    else by detection), and on a GPU host it would detect CUDA, while these references run on the
    CPU device under fake tensors (as harness/parallel/deepspeed.py sets it for CPU cases)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
