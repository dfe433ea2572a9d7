"""``llmbench-plan``: per-device memory of a model nobody ran here, per strategy and world size.

    llmbench-plan --model mistral-7b --strategy ddp,zero2,zero3,fsdp --world-size 8,64,256 \\
        --seq-len 2048 --micro-batch 1 --grad-accum 2 --device-memory-gib 80 [--workload qlora] [--json]

Every figure is estimated (pytest_llmbench/plan.py names its terms). The activation term is measured:
the model's real architecture runs one micro-batch under FakeTensorMode with PyTorch's MemTracker
(harness/memref.py, a few seconds); ``--activation-gib`` declares it instead. ``--check`` also runs
PyTorch's FSDPMemTracker for fsdp at every N and prints it beside the estimate.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness import strategies
from harness.presets import MODEL_PRESETS
from harness.spec import RunSpec, SpecError
from pytest_llmbench import plan

GIB = plan.GIB


def _ints(flag: str):
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: comma-separated positive integers")
        return values
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmbench-plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help=f"a preset: {', '.join(MODEL_PRESETS)}")
    p.add_argument("--strategy", default="ddp,zero2,zero3,fsdp", help="comma-separated strategies")
    p.add_argument("--world-size", type=_ints("--world-size"), default=[1, 8, 64, 256])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--grad-accum", type=_ints("--grad-accum"), default=[1])
    p.add_argument("--workload", default="pretrain", help="pretrain, lora or qlora")
    p.add_argument("--variant", default="base", help="e.g. ac (activation checkpointing), noreshard")
    p.add_argument("--precision", choices=plan.PRECISIONS, default="fp32",
                   help="fp32: fp32 weights (how the harness runs, autocast); bf16: 16-bit weights "
                        "and gradients with fp32 master weights")
    p.add_argument("--device-memory-gib", type=float, default=None, help="say from which N each fits")
    p.add_argument("--activation-gib", type=float, default=None,
                   help="declare activations per micro-batch instead of measuring them under FakeTensorMode")
    p.add_argument("--check", action="store_true", help="run FSDPMemTracker for fsdp beside the estimate")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        names = [s.strip() for s in args.strategy.split(",") if s.strip()]
        for name in names:
            strategies.get(name)
        spec = RunSpec.from_preset(args.model, seq_len=args.seq_len, micro_batch=args.micro_batch)
        spec = spec.replace(workload=args.workload, variant=args.variant or "base")
        problem = spec.workload_problem()
        if problem:
            raise SpecError(problem)
    except (SpecError, strategies.StrategyError, KeyError, ValueError) as exc:
        print(f"llmbench-plan: error: {exc}", file=sys.stderr)
        return 2
    shape = plan.Shape.of(spec)
    if args.activation_gib is not None:
        activations, act_source = args.activation_gib * GIB, "declared (--activation-gib)"
    else:
        from harness import memref

        activations = memref.activation_peak_by_depth(spec)
        act_source = "measured under FakeTensorMode (MemTracker, CPU kernels)"
    parts = frozenset(spec.variant_parts())
    rows = []
    for name in names:
        for accum in args.grad_accum:
            by_n = {n: plan.estimate(name, shape, n, grad_accum=accum, activations=activations,
                                     precision=args.precision, variant_parts=parts) for n in args.world_size}
            if any(e is None for e in by_n.values()):
                continue
            ref = _check(spec, name, accum, args.world_size) if args.check else {}
            rows.append((name, accum, by_n, ref))
    if args.json:
        print(json.dumps(_as_json(args, spec, shape, activations, act_source, rows), indent=2))
        return 0
    print(f"Estimated per-device memory (GiB): {args.model} {args.workload}, micro-batch "
          f"{args.micro_batch} x seq {args.seq_len}, precision {args.precision}, AdamW; activations "
          f"{activations / GIB:.2f} GiB per micro-batch, {act_source}. P = {shape.params:,}, "
          f"P_t = {shape.trainable:,}.")
    print(f"{'strategy':<10}{'accum':>6}" + "".join(f"{'N=' + str(n):>10}" for n in args.world_size))
    for name, accum, by_n, ref in rows:
        print(f"{name:<10}{accum:>6}" + "".join(f"{by_n[n].total / GIB:>10.2f}" for n in args.world_size))
        if ref:
            print(f"{'  FSDPMemTracker':<16}" + "".join(f"{ref[n] / GIB:>10.2f}" for n in args.world_size))
    if args.device_memory_gib:
        for name, accum, by_n, _ in rows:
            print(f"- grad_accum {accum}: " + plan.sentence(name, by_n, args.device_memory_gib))
    return 0


def _check(spec: RunSpec, strategy: str, accum: int, sizes: list[int]) -> dict[int, float]:
    if strategy != "fsdp":
        return {}
    from harness import memref

    return {n: float(memref.fsdp_peak(spec.replace(strategy="fsdp", world_size=n, grad_accum=accum))["total"])
            for n in sizes}


def _as_json(args, spec: RunSpec, shape: plan.Shape, activations: float, source: str, rows) -> dict:
    return {
        "estimated": True, "model": args.model, "workload": spec.workload, "seq_len": spec.seq_len,
        "micro_batch": spec.micro_batch, "precision": args.precision, "params": shape.params,
        "trainable": shape.trainable, "activation_bytes": activations, "activation_source": source,
        "device_memory_gib": args.device_memory_gib,
        "plans": [{"strategy": name, "grad_accum": accum,
                   "fits_from": (plan.fits_from(by_n, args.device_memory_gib * GIB)
                                 if args.device_memory_gib else None),
                   "world_sizes": {str(n): {"total_bytes": e.total, "moment": e.moment,
                                            "terms": [{"name": t.name, "bytes": t.bytes, "formula": t.formula}
                                                      for t in e.terms],
                                            **({"fsdp_mem_tracker_bytes": ref[n]} if ref else {})}
                                   for n, e in by_n.items()}}
                  for name, accum, by_n, ref in rows]}


if __name__ == "__main__":
    sys.exit(main())
