"""The measured training run on one rank (started by torchrun, one process per rank).

    set up device and process group -> build model -> wrap (strategy) -> build data
    -> warm-up + measured steps, each timed between two device synchronisations
    -> read peak memory -> gather per-rank times, losses, memory (after the loop: no
       extra collective inside a timed step) -> the instruments the spec asks for, after the
       measured steps (harness/instruments) -> compute-only probe -> rank 0 summarises.

The last warm-up step is watched by harness/traffic.py: every collective it issues is the
result's ``traffic`` (measured bytes per step); no measured step is watched.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import time
from typing import Any

import torch
import torch.distributed as dist

from harness import compiled, energy, instruments, traffic
from harness.checks import compare, digests
from harness.data import rank_batches
from harness.derive import derive_metrics, max_over_ranks
from harness.dist import all_gather, node_name, setup, synchronize
from harness.env import collect_env
from harness.faults import maybe_inject, recompile_at, slowdown
from harness.model import build_model
from harness.parallel import TorchEngine, build_engine, make_optimizer
from harness.parallel.engine import apply_before_wrap, train_step
from harness.result import GIB, BenchResult
from harness.spec import RunSpec


def run(spec: RunSpec, *, rank: int, local_rank: int, run_id: str, out_dir: str = ".") -> BenchResult | None:
    """Train and measure; rank 0 returns the result, other ranks return None. After the measured
    steps each instrument of ``spec.instruments`` runs its own steps (never measured steps),
    writing any files under ``out_dir``, the case's folder."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    device = setup(spec, local_rank)
    phases["init_process_group_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if compiled.wanted(spec):
        compiled.fresh()
    model = build_model(spec, device)
    counts = {"n_params": model.n_params, "n_trainable": model.n_trainable}
    engine, strategy_config = build_engine(model, spec, device)
    strategy_config["workload"] = model.workload_config
    strategy_config["compute_probe_precision"] = PROBE_PRECISION[spec.precision]
    batches = rank_batches(spec, rank, spec.steps, device)
    phases["build_and_wrap_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    before = digests(engine.module)
    phases["checks_s"] = time.perf_counter() - t0
    maybe_inject(rank)
    meter = energy.Meter(device.type, local_rank, device.index or 0)
    reset_peak_memory(device)
    counted = compiled.snapshot() if compiled.wanted(spec) else None
    per_step: list[int] = []
    times, losses, messages = timed_steps(engine, batches, spec, device, rank=rank, phase="train",
                                          record_step=spec.warmup_steps - 1, meter=meter,
                                          compiles=per_step if counted else None)
    compile_record = compiled.record(counted, per_step, spec.warmup_steps) if counted else None
    if compile_record:
        compiled.check(compile_record, rank)
    memory = read_peak_memory(device, rank)
    t0 = time.perf_counter()
    after = digests(engine.module)  # before tracing: the digests are of the measured steps' weights
    phases["checks_s"] += time.perf_counter() - t0
    recorded = instruments.record(spec.instruments, phases=phases, engine=engine, batches=batches, spec=spec,
                                  device=device, rank=rank, out_dir=out_dir)
    gathered = all_gather({"times": times, "losses": losses, "memory": memory, "digests": (before, after),
                           "traffic": traffic.summarize(messages), "energy": meter.reading(),
                           "node": node_name(), "instruments": recorded, "compile": compile_record})
    t0 = time.perf_counter()
    engine.close()
    del engine, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    probe_all = all_gather(compute_probe(spec, batches, device, rank))  # [(times, why not), ...]
    phases["compute_probe_s"] = time.perf_counter() - t0
    result = summarize(spec, gathered, probe_all, counts=counts, device=device,
                       strategy_config=strategy_config, phases=phases, run_id=run_id) if rank == 0 else None
    dist.barrier()  # nobody tears the process group down while rank 0 is still summarising
    return result


def summarize(spec: RunSpec, gathered: list[dict], probe_all: list[tuple[list[float], str | None]],
              *, counts: dict[str, int], device: torch.device,
              strategy_config: dict, phases: dict, run_id: str) -> BenchResult:
    """Rank 0: combine every rank's raw measurements into one BenchResult."""
    step_times = max_over_ranks([g["times"] for g in gathered])
    warmup, measured = step_times[: spec.warmup_steps], step_times[spec.warmup_steps:]
    mean_losses = [sum(step) / len(step) for step in zip(*(g["losses"] for g in gathered), strict=True)]
    probes = [times for times, _ in probe_all]
    probe_times = max_over_ranks(probes) if all(probes) else []
    env = collect_env(device, world_size=spec.world_size, nnodes=spec.nnodes)
    memory_per_rank = [g["memory"] for g in gathered]
    energy_per_rank = [g["energy"] for g in gathered]
    per_rank = [{"rank": r, "node": g["node"], "step_times_s": g["times"][spec.warmup_steps:],
                 "compute_only_step_times_s": probes[r],
                 **({"compiled_frames": g["compile"]["frames"]} if g["compile"] else {})}
                for r, g in enumerate(gathered)]
    recorded = {name: [g["instruments"][name] for g in gathered] for name in spec.instruments}
    metrics, nulls = derive_metrics(spec, **counts, step_times_s=measured,
                                    compute_only_step_times_s=probe_times, losses=mean_losses,
                                    memory_per_rank=memory_per_rank, device_name=env["device_name"],
                                    energy_per_rank=energy_per_rank, per_rank=per_rank,
                                    compiled_per_rank=[g["compile"] for g in gathered],
                                    warmup_step_times_s=warmup)
    metrics.update(instruments.derive(recorded))
    if any(why for _, why in probe_all):
        nulls["step_overhead"] = probe_failure([why for _, why in probe_all])
    checks = compare([g["digests"][0] for g in gathered], [g["digests"][1] for g in gathered])
    rows, steady = gathered[0]["traffic"], spec.warmup_steps >= 3
    checks["traffic_same_on_every_rank"] = all(g["traffic"] == rows for g in gathered)
    if spec.warmup_steps == 0:
        nulls["traffic"] = "no warm-up step to watch (warmup_steps = 0): traffic is recorded on the last one"
    elif not steady:
        nulls["traffic_steady"] = (f"recorded on warm-up step {spec.warmup_steps}: steady from step 3 on "
                                   f"(DDP rebuilds its buckets in step 2, ZeRO-3 traces step 1)")
    return BenchResult(spec=spec, status="ok", run_id=run_id, env=env, checks=checks,
                       strategy_config=strategy_config, n_params=counts["n_params"],
                       step_times_s=measured, warmup_step_times_s=warmup,
                       compute_only_step_times_s=probe_times, losses=mean_losses,
                       memory_per_rank=memory_per_rank, energy_per_rank=energy_per_rank,
                       per_rank=per_rank, instruments=recorded, metrics=metrics, null_reasons=nulls,
                       phases_s=phases, traffic=rows,
                       traffic_step=spec.warmup_steps if spec.warmup_steps else None)


def probe_failure(reasons: list[str | None]) -> str:
    """Why the compute-only probe gave no times, from each rank's reason (None: it ran): the reason
    alone when every rank gives it (disabled), else each with the ranks it happened on (an OOM on
    one rank's device)."""
    if len(set(reasons)) == 1:
        return str(reasons[0])
    by_reason: dict[str, list[int]] = {}
    for rank, why in enumerate(reasons):
        if why:
            by_reason.setdefault(why, []).append(rank)
    return "; ".join(f"{why} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
                     for why, ranks in by_reason.items())


def timed_steps(engine: Any, batches: list, spec: RunSpec, device: torch.device, *, rank: int,
                phase: str, record_step: int = -1, meter: energy.Meter | None = None,
                compiles: list[int] | None = None) -> tuple[list[float], list[float], list[dict]]:
    """Run every step in ``batches``; per step its wall time (synchronised) and loss, and the
    collectives of step ``record_step`` (0-based; -1: none) as harness/traffic.py records them.
    ``meter`` reads its energy counter before the first measured step and after the last;
    ``compiles``, where given, gets the frames dynamo compiled in each step."""
    times, losses, messages = [], [], []
    slow = slowdown(rank)
    counting = compiles is not None
    for step, micro_batches in enumerate(batches):
        frames = compiled.frames() if counting else 0
        if counting:
            recompile_at(step)
        synchronize(device)
        if meter is not None and step == spec.warmup_steps:
            meter.start()
        start = time.perf_counter()
        watch = traffic.recording() if step == record_step else contextlib.nullcontext([])
        with watch as recorded:
            loss_sum = train_step(engine, micro_batches)
        messages.extend(recorded)
        synchronize(device)
        if slow:  # LLMBENCH_SLOWDOWN: a known regression for the gate's end-to-end test
            time.sleep(slow * (time.perf_counter() - start))
        times.append(time.perf_counter() - start)
        if counting:
            compiles.append(compiled.frames() - frames)
        losses.append(loss_sum.item() / len(micro_batches))
        # every rank reports its steps (a launcher tells a stuck rank from a working one);
        # rank 0's lines are the progress users see, rank R's carry "[R]"
        kind = "warmup" if step < spec.warmup_steps else "measure"
        print(f"llmbench{f'[{rank}]' if rank else ''} {phase} step {step + 1}/{len(batches)} {kind} "
              f"time_s={times[-1]:.4f} loss={losses[-1]:.4f}", flush=True)
    if meter is not None:
        meter.stop()
    return times, losses, messages


def compute_probe(spec: RunSpec, batches: list, device: torch.device, rank: int,
                  ) -> tuple[list[float], str | None]:
    """Time ``compute_probe_steps`` steps of the plain model on each rank (after one warm-up).

    Same model (with the variant's activation checkpointing), micro-batch and grad-accum as
    the measured run, but no wrapper and no communication, so ``1 - probe / step`` is the
    share of the step spent waiting on communication. Returns ([], reason) if disabled or if
    the full model does not fit.
    """
    if spec.compute_probe_steps == 0:
        return [], "compute_probe_steps = 0"
    steps = [batches[i % len(batches)] for i in range(spec.compute_probe_steps + 1)]
    try:
        model = probe_model(spec, device)
        engine = TorchEngine(model, make_optimizer(model, spec), spec=spec, device=device,
                             sync=lambda last: contextlib.nullcontext(),
                             clip=lambda c: torch.nn.utils.clip_grad_norm_(model.parameters(), c))
        times, _, _ = timed_steps(engine, steps, spec.replace(warmup_steps=1), device,
                               rank=rank, phase="compute-only")
    except torch.OutOfMemoryError:
        return [], "compute-only probe ran out of memory (the unsharded model does not fit)"
    return times[1:], None


# How the compute-only probe computes, by RunSpec.precision: as the measured run's wrapper does.
PROBE_PRECISION = {
    "fp32": "fp32",
    "autocast": "bf16 autocast over fp32 parameters, as the run",
    "native": "bf16 parameters (the dtype the strategy's own mixed precision computes in), fp32 loss",
}


def probe_model(spec: RunSpec, device: torch.device) -> torch.nn.Module:
    """The probe's plain model: the run's model with the variant's recompute (ac), computing in the
    run's precision. "native" strategies (FSDP's param_dtype, DeepSpeed's bf16 section) compute every
    op in bf16, so the probe's model is cast to bf16; without the cast it would compute in fp32 (TF32
    off: 67 against 989 dense TFLOP/s on an H100) and the overhead ``1 - probe / step`` go negative.
    "autocast" runs under torch.autocast in TorchEngine as the run does."""
    model = build_model(spec, device)
    apply_before_wrap(model, spec, {})  # the same recompute as the run (variant ac)
    if compiled.wanted(spec):  # and compiled as the run (its first, unmeasured step compiles)
        compiled.blocks(model)
    if spec.precision == "native":
        model.to(torch.bfloat16)
    return model


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak counters at the first step (not at model build or wrap)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) of this process
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # then VmHWM / ru_maxrss is the lifetime peak; read_peak_memory says so


def read_peak_memory(device: torch.device, rank: int) -> dict[str, Any]:
    memory: dict[str, Any] = {"rank": rank}
    if device.type == "cuda":
        memory["max_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        memory["max_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        memory["nvml_used_gib_after_loop"] = _nvml_used_gib(device)
        memory.update(cuda_reserve(device))
        return memory
    memory["peak_rss_gib"], memory["peak_rss_source"] = _peak_rss_gib()
    return memory


def _peak_rss_gib() -> tuple[float, str]:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GIB, "VmHWM since the first step"
    except OSError:
        pass
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024 / GIB, "ru_maxrss (process lifetime)"


def _nvml_used_gib(device: torch.device) -> float | None:
    try:
        import pynvml

        return pynvml.nvmlDeviceGetMemoryInfo(energy.nvml_handle(pynvml, device.index)).used / GIB
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def cuda_reserve(device: torch.device) -> dict[str, float]:
    """What a GPU gives up beyond the tensors the planner counts, measured after the loop (the planner's
    CUDA reserve, issue 43): ``outside_allocator_gib``, device memory in use that PyTorch's caching
    allocator does not hold (the CUDA context, NCCL's buffers, cuBLAS/cuDNN handles' own memory):
    total - free (``torch.cuda.mem_get_info``, the driver's figures) - ``memory_reserved``; and
    ``allocator_slack_gib``, what the allocator held at its peak beyond the tensors it served
    (fragmentation and cached blocks): ``max_memory_reserved - max_memory_allocated``."""
    free, total = torch.cuda.mem_get_info(device)
    return {"device_total_gib": total / GIB,
            "outside_allocator_gib": (total - free - torch.cuda.memory_reserved(device)) / GIB,
            "allocator_slack_gib": (torch.cuda.max_memory_reserved(device)
                                    - torch.cuda.max_memory_allocated(device)) / GIB}

