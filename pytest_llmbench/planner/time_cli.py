"""``llmbench-plan --time --device NAME``: the step-time predictor's flags, checks and output.

    llmbench-plan --model mpt-7b.json --device h100-sxm --world-size 8,64 --devices-per-node 8 \\
        --inter-node-gbps 1600 --seq-len 2048 --micro-batch 6 --strategy fsdp --precision bf16 --time

Per strategy, grad_accum and N: the estimated step time, tokens/s per device, MFU and the terms
(pytest_llmbench/planner/steptime.py), beside the memory plan. ``--model`` is a preset or the path of a
Hugging Face config.json; the operators are counted on that architecture under FakeTensorMode.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from harness import bookkeeping, devices, strategies
from pytest_llmbench.planner import contention, interval, step, steptime, timing


def add_arguments(p: argparse.ArgumentParser, number, ints) -> None:
    p.add_argument(
        "--time",
        action="store_true",
        help="predict the step time on --device (estimated: operators timed by the device's roofline "
        "with global efficiencies fitted on published measurements, docs/PLAN.md)",
    )
    p.add_argument("--device", help=f"the device table's part for --time: {', '.join(devices.DEVICES)}")
    p.add_argument(
        "--devices-per-node",
        type=ints("--devices-per-node"),
        default=None,
        help="GPUs per node (default: the profile's, else 8)",
    )
    p.add_argument(
        "--inter-node-gbps",
        type=number("--inter-node-gbps"),
        default=None,
        help="the node's NICs together, Gb/s (1600 = 8 x 200 Gb/s RoCE); needed beyond one node "
        "unless the profile declares [network] inter_node_busbw_gbps",
    )
    p.add_argument(
        "--overlap-comm",
        choices=("true", "false"),
        default=None,
        help="DeepSpeed's overlap_comm for zero2/zero3 (default: the harness's config, true): false puts "
        "its collectives on the compute stream, where compute hides none of them",
    )
    p.add_argument(
        "--grad-sync",
        choices=("step", "micro-batch"),
        default=None,
        help="when FSDP reduces the gradients: step (default, as the harness runs it: no_sync until the "
        "last micro-batch) or micro-batch (Composer's and torchtitan's FSDP under full sharding): each "
        "micro-batch's reduce-scatter, and FSDP's casts and divides around it, timed",
    )


@dataclass(frozen=True)
class Setting:
    device: devices.Device
    network: step.Network
    sync: timing.Sync = timing.Sync()


def setting(args: argparse.Namespace, profile) -> Setting | None:
    """The device and network for --time, checked against every --world-size; None without --time.
    Raises ValueError naming the flag."""
    if not args.time:
        if args.device:
            raise ValueError("--device is read with --time (the step-time predictor)")
        return None
    if not args.device:
        raise ValueError(f"--time needs --device: one of {', '.join(devices.DEVICES)}")
    device = devices.get(args.device)
    per_node = args.devices_per_node[0] if args.devices_per_node else None
    declared = None
    source = "--devices-per-node" if per_node else ""
    if per_node is None and profile is not None and profile.devices_per_node:
        per_node, source = profile.devices_per_node, f"profile {profile.name}"
    if per_node is None:
        per_node, source = 8, "default 8 a node"
    if args.inter_node_gbps is None and profile is not None:
        declared = profile.network.get("inter_node_busbw_gbps")
    for n in args.world_size:
        if n > per_node and n % per_node:
            raise ValueError(
                f"--world-size {n}: above one node of {per_node} devices ({source}) and not a whole "
                f"number of nodes"
            )
        if n > per_node and not (args.inter_node_gbps or declared):
            raise ValueError(
                f"--world-size {n} spans {n // per_node} nodes: --inter-node-gbps (the node's NICs, "
                f"Gb/s) or a --profile with [network] inter_node_busbw_gbps is needed"
            )
    link = (
        f"--inter-node-gbps {args.inter_node_gbps:g}"
        if args.inter_node_gbps
        else f"declared inter_node_busbw_gbps {declared:g} (profile)"
        if declared
        else "one node"
    )
    network = step.Network(
        per_node, args.inter_node_gbps, declared, f"{per_node} a node ({source}); {link}"
    )
    overlap = getattr(args, "overlap_comm", None)
    grads = "micro_batch" if getattr(args, "grad_sync", None) == "micro-batch" else "step"
    return Setting(device, network, timing.Sync(grads=grads, overlap_comm=overlap != "false"))


def check(setting: Setting, spec, names: list[str], sizes: list[int]) -> None:
    """Raises ValueError naming a strategy and variant the predictor cannot time, with the reason
    (planner/timing.py ``problem``)."""
    for name in names:
        row = strategies.find(name)
        if not setting.sync.overlap_comm and row is not None and "deepspeed" not in row.engine:
            raise ValueError(f"--overlap-comm false: DeepSpeed's setting (its ZeRO strategies); --strategy "
                             f"{name} ({row.engine}) always reduces its gradients beside the backward")
        per_micro_batch = row is not None and row.bookkeeping in bookkeeping.PER_MICRO_BATCH
        if setting.sync.grads == "micro_batch" and row is not None and not per_micro_batch:
            raise ValueError(f"--grad-sync micro-batch: FSDP's choice (--strategy fsdp or fsdp1); --strategy "
                             f"{name} ({row.engine}) is timed as the harness runs it, reducing once a step")
        for n in sizes:
            why = timing.problem(spec.replace(strategy=name), n, setting.network.devices_per_node)
            if why:
                raise ValueError(f"--time --strategy {name} --variant {spec.variant} at N={n}: {why}")


def predict(
    setting: Setting, spec, config: dict | None, names: list[str], accums: list[int], sizes: list[int]
) -> dict[tuple[str, int], dict[int, steptime.Prediction]]:
    """{(strategy, grad_accum): {N: Prediction}} (``check`` first), each answer with its interval: how
    far such answers have been off (planner/interval.py)."""
    out = {
        (name, accum): {
            n: timing.predict(spec.replace(strategy=name), setting.device, setting.network, world_size=n,
                              grad_accum=accum, config=config, sync=setting.sync)
            for n in sizes
        }
        for name in names
        for accum in accums
    }
    for by_n in out.values():
        for p in by_n.values():
            p.interval = interval.of(p.tokens_per_s_per_device, setting.device.name)
    return out


def print_table(setting: Setting, predictions: dict, sizes: list[int]) -> None:
    fit, channels = steptime.FIT, contention.nccl_channels(setting.device)
    print(
        f"\nEstimated step time on {setting.device.label} ({setting.network.source}), bf16: the model's "
        f"operators timed by the device's roofline (GEMM {fit.gemm:.0%} of the part's measured MAMF, flash "
        f"attention {fit.attention:.0%} of FlashAttention-2's published best, memory-bound "
        f"{fit.memory:.0%} of HBM, {fit.launch_us:g} us a kernel: global values fitted on published H100 "
        f"and A100 runs, docs/PLAN.md), NCCL's ring over the links, compute hiding it; what the hidden "
        f"communication costs the compute: NCCL's {channels.count} channels of the part's "
        f"{setting.device.sms} SMs while it runs ({channels.said}), and the bytes it stages through HBM."
    )
    if setting.device.stand_ins():
        print(f"Stand-ins on the {setting.device.label}: " + "; ".join(setting.device.stand_ins()) + ".")
    print(
        f"{'strategy':<10}{'accum':>6}"
        + "".join(f"{'N=' + str(n) + ' s  tok/s/dev  MFU':>30}" for n in sizes)
    )
    for (name, accum), by_n in predictions.items():
        print(
            f"{name:<10}{accum:>6}"
            + "".join(
                f"{p.step_time_s:>10.3f}{p.tokens_per_s_per_device:>11,.0f}{p.mfu:>9.1%}"
                for p in by_n.values()
            )
        )
    said = None
    for (name, accum), by_n in predictions.items():
        spans = {n: p.interval for n, p in by_n.items()}
        said = next(iter(spans.values()))
        print(f"- {name} grad_accum {accum}: tok/s/dev interval "
              + "; ".join(f"N={n} {iv['low']:,.0f}-{iv['high']:,.0f}" for n, iv in spans.items()))
    if said:
        low, high = (1 - said["level"]) / 2, (1 + said["level"]) / 2
        print(f"  (the interval: the {ordinal(low * 100)}-{ordinal(high * 100)} percentiles of the "
              f"{said['from']}; it held "
              f"{said['coverage_on_leave_out']:.0%} of the held-out rows, each judged without its own "
              f"source: docs/PLAN.md)")
    for name in dict.fromkeys(name for name, _ in predictions):
        if facts := deepspeed_facts(name, setting.sync):
            print(f"  ({name} as the harness runs it, harness/configs/{name}.json: {facts})")
    unsaid = (line for by_n in predictions.values() for p in by_n.values() for line in p.not_stated)
    for line in dict.fromkeys(unsaid):
        print(f"  (not stated: {line})")
    for (name, accum), by_n in predictions.items():
        p = by_n[max(sizes)]
        terms = ", ".join(f"{k} {v:.3f} s" for k, v in p.terms.items() if v)
        print(f"- {name} grad_accum {accum} at N={p.world_size}: {terms}")
        k = p.kernels
        if k and k["kernels"] != k["eager_kernels"]:
            print(f"  memory-bound work of a micro-batch as torch.compile fuses it (planner/fusion.py): "
                  f"{k['kernels']:,.0f} kernels moving {k['gb']:,.1f} GB (eager: {k['eager_kernels']:,.0f} "
                  f"kernels, {k['eager_gb']:,.1f} GB)")


GIB = 2**30


def ordinal(x: float) -> str:
    """1st, 2nd, 3rd, 2.5th, 11th, 99th: a percentile as the interval's line says it."""
    said = f"{x:g}"
    if "." in said or said[-2:] in ("11", "12", "13"):
        return f"{said}th"
    return said + {"1": "st", "2": "nd", "3": "rd"}.get(said[-1], "th")


def device_limit_gib(setting: Setting, declared_gib: float | None) -> tuple[float, str]:
    """The memory a plan must fit for --time: --device-memory-gib where given, else the part's own."""
    if declared_gib:
        return declared_gib, "--device-memory-gib"
    device = setting.device
    return device.memory_gib, f"the {device.label}'s {device.memory_mib:,} MiB (nvidia-smi memory.total)"


def misfits(setting: Setting, declared_gib: float | None, rows) -> list[tuple[str, int, int, str]]:
    """(strategy, grad_accum, N, sentence) for every predicted step whose memory plan does not fit the
    device: a step time is no answer for a run that cannot start."""
    limit, source = device_limit_gib(setting, declared_gib)
    out = []
    for name, accum, by_n, _ in rows:
        for n, estimate in by_n.items():
            if estimate.total > limit * GIB:
                out.append((name, accum, n, f"{name} grad_accum {accum} at N={n} does not fit: estimated "
                                            f"{estimate.total / GIB:.1f} GiB per device against {limit:.1f} "
                                            f"GiB ({source}); its step time is of a run that cannot start"))
    return out


def deepspeed_facts(strategy: str, sync: timing.Sync = timing.Sync()) -> str:
    """What decides a ZeRO step, in DeepSpeed's own terms, as the harness configures it (or --overlap-comm
    states it) and the predictor takes it: its overlap, prefetch, persistence and bucket settings; "" for
    another strategy."""
    import json
    from pathlib import Path

    import harness

    path = Path(harness.__file__).resolve().parent / "configs" / f"{strategy}.json"
    if not strategy.startswith("zero") or not path.is_file():
        return ""
    zero = json.loads(path.read_text())["zero_optimization"]
    overlap = zero.get("overlap_comm", False) and sync.overlap_comm
    said = ["overlap_comm true (its collectives run beside compute, and the exposed term is what compute "
            "cannot hide)" if overlap else
            f"overlap_comm false{' (--overlap-comm)' if not sync.overlap_comm else ''} (its gathers and "
            f"reductions run on the compute stream: all of them exposed, every micro-batch)",
            f"reduce_bucket_size {zero.get('reduce_bucket_size', 5e8):.3g} elements"]
    if "stage3_prefetch_bucket_size" in zero:
        said.append(f"stage3_prefetch_bucket_size {zero['stage3_prefetch_bucket_size']:.3g} elements (the "
                    f"next blocks' gathers issued ahead)")
    if "stage3_param_persistence_threshold" in zero:
        said.append(f"stage3_param_persistence_threshold {zero['stage3_param_persistence_threshold']:.3g} "
                    f"(smaller parameters stay gathered: gathered once a step, zero3_persistent)")
    return "; ".join(said)
