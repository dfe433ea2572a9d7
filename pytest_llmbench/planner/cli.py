"""``llmbench-plan``: per-device memory and step time of a model nobody ran here, per strategy and N.

    llmbench-plan --model mistral-7b --strategy ddp,zero2,zero3,fsdp --world-size 8,64,256 \\
        --seq-len 2048 --micro-batch 1 --grad-accum 2 --device-memory-gib 80 [--workload qlora] [--json]
    llmbench-plan --profile a10-qlora --mfu 0.3      # a profile's model, batch, N, memory and links
    llmbench-plan --model config.json --device h100-sxm --world-size 8,64 --inter-node-gbps 1600 --time

Every figure is estimated (pytest_llmbench/planner/memory.py names its terms). The activation term is
measured: the model's real architecture runs one micro-batch under FakeTensorMode with PyTorch's MemTracker
(planner/memref.py, a few seconds), at the precision each strategy computes in; ``--activation-gib``
declares it instead. ``--check`` also runs the references at every N and prints their peak beside
the estimate: PyTorch's FSDPMemTracker on FSDP2, its MemTracker on DeepSpeed's own ZeRO-2/3 engine
(about 2-4 minutes a size for a 7-8B model). ``--mfu`` (stated,
model FLOPs) with a peak (``--peak-tflops`` or the profile's device) and a bus bandwidth
(``--busbw-gbps`` or the profile's declared [network]) adds the step time: compute at that MFU plus
the strategy's traffic formula (held to measured traffic) over the link, none of it hidden unless
``--overlap`` says so. ``--time --device NAME`` predicts the step instead (planner/steptime.py: the
model's operators timed by the part's roofline, NCCL's ring model, global efficiencies fitted on
published runs); ``--model`` also takes a Hugging Face config.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from harness import strategies
from harness.devices import DEVICES, DeviceError
from harness.presets import MODEL_PRESETS
from harness.spec import RunSpec, SpecError
from pytest_llmbench.planner import configs, memory_plan, mfu_cli, references, time_cli
from pytest_llmbench.planner import memory as plan
from pytest_llmbench.profiles import Profile, ProfileError, load_profiles

GIB = plan.GIB


# The largest world size planned: over a million devices, beyond any cluster built; ZeRO's
# partition arithmetic counts per rank (harness/shapes.zero_touched_by_rank), so N bounds its work.
MAX_WORLD_SIZE = 1 << 20


def _ints(flag: str, top: int | None = None):
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: comma-separated positive integers")
        if top is not None and max(values) > top:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: at most {top:,}")
        return values
    return parse


def _number(flag: str, *, low: float = 0.0, high: float = math.inf, low_ok: bool = False):
    """A finite number in (low, high] (``low_ok``: [low, high]); NaN and infinity are refused."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value >= low if low_ok else value > low
        if not (math.isfinite(value) and above and value <= high):
            where = (f"in {'[' if low_ok else '('}{low:g}, {high:g}]" if math.isfinite(high)
                     else f"{'at least' if low_ok else 'above'} {low:g}")
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {where}")
        return value
    return parse


def _one(parse):
    """One value of a comma-list parser (``--seq-len 2048``)."""
    def single(text: str) -> int:
        values = parse(text)
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"{text!r}: one positive integer")
        return values[0]
    return single


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmbench-plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", help="take model, workload, variant, batch, seq len, world sizes, device "
                                     "memory, peak FLOP/s and links from this profile (flags override)")
    p.add_argument("--profile-file", action="append", default=[], help="a profile TOML file to load")
    p.add_argument("--model", help=f"a preset ({', '.join(MODEL_PRESETS)}), the path of a Hugging Face "
                                   f"config.json, or a model folder holding one (a multimodal config: its "
                                   f"text_config)")
    p.add_argument("--strategy", default=None,
                   help="comma-separated strategies (default ddp,zero2,zero3,fsdp)")
    p.add_argument("--world-size", type=_ints("--world-size", MAX_WORLD_SIZE), default=None,
                   help="default 1,8,64,256")
    p.add_argument("--seq-len", type=_one(_ints("--seq-len")), default=None, help="default 2048")
    p.add_argument("--micro-batch", type=_one(_ints("--micro-batch")), default=None, help="default 1")
    p.add_argument("--grad-accum", type=_ints("--grad-accum"), default=None, help="default 1")
    p.add_argument("--workload", default=None, help="pretrain (default), lora or qlora")
    p.add_argument("--variant", default=None,
                   help="one variant, its parts joined by + or commas: e.g. ac (every block recomputed), "
                        "ac-op (torchtitan's op-level recompute), ac-every2, hsdp,ac, noreshard, bf16-reduce")
    p.add_argument("--precision", choices=plan.PRECISIONS, default=None,
                   help="fp32: fp32 weights (how the harness runs, autocast); bf16: 16-bit weights "
                        "and gradients with fp32 master weights")
    p.add_argument("--device-memory-gib", type=_number("--device-memory-gib"), default=None,
                   help="say from which N each fits")
    p.add_argument("--activation-gib", type=_number("--activation-gib", low_ok=True), default=None,
                   help="declare activations per micro-batch instead of measuring them under FakeTensorMode")
    p.add_argument("--check", action="store_true",
                   help="run the references beside the estimate: FSDPMemTracker for fsdp, DeepSpeed's "
                        "engine under MemTracker for zero2/zero3")
    p.add_argument("--mfu", type=_number("--mfu", high=1.0), default=None,
                   help="stated model-FLOPs utilisation (0.3 = 30%%): adds the estimated step time")
    p.add_argument("--peak-tflops", type=_number("--peak-tflops"), default=None,
                   help="dense bf16 peak of one device")
    p.add_argument("--busbw-gbps", type=_number("--busbw-gbps"), default=None,
                   help="bus bandwidth of the link (GB/s)")
    p.add_argument("--overlap", type=_number("--overlap", high=1.0, low_ok=True), default=0.0,
                   help="share of compute that hides communication")
    p.add_argument("--adamw", choices=("foreach", "for-loop"), default="foreach",
                   help="AdamW's implementation, whose step temporaries differ: foreach (torch's default on "
                        "CUDA, the default here) or for-loop (CPU's default; what --check's tracker runs)")
    time_cli.add_arguments(p, _number, _ints)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


DEFAULTS = {"strategy": "ddp,zero2,zero3,fsdp", "world_size": [1, 8, 64, 256], "seq_len": 2048,
            "micro_batch": 1, "grad_accum": [1], "workload": "pretrain", "variant": "base",
            "precision": "fp32"}


def resolve(args: argparse.Namespace) -> tuple[argparse.Namespace, Profile | None]:
    """Fill what the flags left out from ``--profile`` (if any), then from DEFAULTS. A
    ``--profile-file`` is read whenever given, so a malformed one is an error even without
    ``--profile``."""
    profile = None
    if args.profile or args.profile_file:
        try:
            profiles = load_profiles(args.profile_file)
        except ProfileError as exc:
            raise ValueError(str(exc)) from None
    if args.profile:
        if args.profile not in profiles:
            raise ValueError(f"--profile {args.profile!r}: no such profile; known: {', '.join(profiles)}")
        profile = profiles[args.profile]
        taken = {"model": profile.model, "strategy": ",".join(profile.strategies),
                 "world_size": memory_plan.world_sizes(profile), "seq_len": max(profile.seq_lens),
                 "precision": profile.dtype,
                 "micro_batch": profile.micro_batch, "grad_accum": [profile.grad_accum],
                 "workload": profile.workloads[0], "variant": profile.variants[0],
                 "device_memory_gib": profile.memory_gib, "peak_tflops": _profile_peak(profile)}
        for key, value in taken.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.model is None:
        raise ValueError("--model (a preset) or --profile is required")
    return args, profile


def _profile_peak(profile: Profile) -> float | None:
    """The dense bf16 peak (TFLOP/s) of the profile's parts of the device table (harness/devices.py);
    None where it names none, or several with different peaks (h100's SXM, PCIe and NVL parts: then
    --peak-tflops says which)."""
    peaks = {DEVICES[name].dense_bf16_tflops for name in profile.parts}
    return peaks.pop() if len(peaks) == 1 else None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args, profile, table_rows, spec, config, timing = _inputs(args)
        names = [row.name for row in table_rows]
        by_name = {row.name: row for row in table_rows}
        times = mfu_cli.step_times(args, profile, spec, table_rows) if args.mfu is not None else []
    except (SpecError, strategies.StrategyError, DeviceError, KeyError, ValueError) as exc:
        print(f"llmbench-plan: error: {exc}", file=sys.stderr)
        return 2
    shape = plan.Shape.of(spec)
    if args.activation_gib is not None:
        activations = dict.fromkeys(names, args.activation_gib * GIB)
        act_source = "declared (--activation-gib)"
    else:
        activations, act_source = memory_plan.activations(spec, names)
    act_term = ("declared per micro-batch (--activation-gib)" if args.activation_gib is not None
                else plan.MEASURED_ACTIVATIONS)
    rows = [(r.strategy, r.grad_accum, r.by_n,
             references.check(spec, by_name[r.strategy], r.grad_accum, args.world_size) if args.check else {})
            for r in memory_plan.estimates(spec, names, args.world_size, args.grad_accum, activations,
                                           foreach=args.adamw == "foreach", activation_source=act_term,
                                           end=None if args.activation_gib is not None
                                           else memory_plan.end_activations(spec, names))]
    predicted = (time_cli.predict(timing, spec, config, names, args.grad_accum, args.world_size)
                 if timing else {})
    misfits = time_cli.misfits(timing, args.device_memory_gib, rows) if timing else []
    for *_, said in misfits:  # on stderr, with --json too
        print(f"warning: {said}", file=sys.stderr)
    if args.json:
        # strict JSON: every number entered finite (the flags' parsers), so none leaves as NaN
        print(json.dumps(_as_json(args, spec, shape, activations, act_source, rows, times, predicted,
                                  misfits), indent=2, allow_nan=False))
        return 0
    _print_memory(args, shape, activations, act_source, rows)
    if times:
        mfu_cli.print_times(args, times)
    if predicted:
        time_cli.print_table(timing, predicted, args.world_size)
    return 0


def _inputs(args: argparse.Namespace) -> tuple:
    """(args, profile, strategy rows, spec, config.json or None, --time setting or None), every input
    checked where it enters: a ValueError (or the spec's, the table's, the device table's) names it.
    The planner's door: each strategy named is resolved to its row here, once."""
    args, profile = resolve(args)
    rows = [strategies.get(name.strip()) for name in args.strategy.split(",") if name.strip()]
    names = [row.name for row in rows]
    lora = {f"lora_{k}": v for k, v in profile.lora.items()} if profile else {}
    config = None
    if configs.is_config_path(args.model):
        config = configs.read_config(args.model)
        configs.check_config(config, args.model)
        spec = configs.spec_of_config(config, args.model, seq_len=args.seq_len,
                                       micro_batch=args.micro_batch, **lora)
    else:
        spec = RunSpec.from_preset(args.model, seq_len=args.seq_len, micro_batch=args.micro_batch, **lora)
    # at --precision: what each strategy computes in and sends in bf16 (RunSpec.precision)
    spec = spec.replace(workload=args.workload, variant=(args.variant or "base").replace(",", "+"),
                        dtype=args.precision)
    problem = spec.workload_problem() or spec.depth_problem()
    if problem:
        raise SpecError(problem)
    if args.mfu is not None and not args.peak_tflops:
        raise ValueError("--mfu needs a peak: --peak-tflops, or a --profile whose parts name one "
                         "part of the device table, harness/devices.py (e.g. a10; h100's match three parts)")
    timing = time_cli.setting(args, profile)
    if timing and spec.workload != "pretrain":
        raise ValueError(f"--time predicts pre-training steps; workload {spec.workload} is not modelled (its "
                         f"frozen weights take no weight gradient and QLoRA dequantises them: neither is "
                         f"counted yet)")
    if timing:
        time_cli.check(timing, spec, names, args.world_size)
    return args, profile, rows, spec, config, timing


def _not_planned(args) -> list[str]:
    """Why each strategy asked for has no memory plan (its row declares no memory terms, or a family the
    planner lacks)."""
    return [why for n in args.strategy.split(",") if n.strip() and (why := plan.why_unplanned(n.strip()))]


def _print_memory(args, shape: plan.Shape, activations: dict, act_source: str, rows: list[tuple]) -> None:
    print(f"Estimated per-device memory (GiB): {args.model} {args.workload}, micro-batch "
          f"{args.micro_batch} x seq {args.seq_len}, precision {args.precision}, AdamW {args.adamw}; "
          f"activations {_describe_activations(activations)} GiB per micro-batch, {act_source}. "
          f"P = {shape.params:,}, "
          f"P_t = {shape.trainable:,}.")
    print(f"{'strategy':<12}{'accum':>6}" + "".join(f"{'N=' + str(n):>10}" for n in args.world_size))
    for name, accum, by_n, ref in rows:
        print(f"{name:<12}{accum:>6}" + "".join(f"{by_n[n].total / GIB:>10.2f}" for n in args.world_size))
        if ref:
            label = f"  {ref[args.world_size[0]]['name']}"
            print(f"{label:<18}" + "".join(f"{ref[n]['categories']['total'] / GIB:>10.2f}"
                                           for n in args.world_size))
            print(f"{'  est/ref - 1':<18}" + "".join(f"{references.error(by_n[n], ref[n]):>+10.1%}"
                                                     for n in args.world_size))
    for name, accum, by_n, ref in rows:
        for n in (n for n in args.world_size if ref and references.beyond(references.error(by_n[n], ref[n]))):
            print(f"warning: {name} grad_accum {accum} N={n}: the estimate is "
                  f"{references.beyond(references.error(by_n[n], ref[n]))} against {ref[n]['name']}",
                  file=sys.stderr)
    for why in _not_planned(args):
        print(f"- {why}")
    if args.device_memory_gib:
        for name, accum, by_n, _ in rows:
            print(f"- grad_accum {accum}: " + plan.sentence(name, by_n, args.device_memory_gib))
        print(f"(fits: {memory_plan.RESERVE_NOTE}.)")


def _describe_activations(activations: dict[str, float]) -> str:
    """``2.23`` where every strategy computes alike, else ``ddp 2.73, zero2 1.62``."""
    if len(set(activations.values())) == 1:
        return f"{next(iter(activations.values())) / GIB:.2f}"
    return ", ".join(f"{name} {value / GIB:.2f}" for name, value in activations.items())


def _as_json(args, spec: RunSpec, shape: plan.Shape, activations: dict[str, float], source: str, rows,
             times, predicted: dict, misfits: list) -> dict:
    unfit = {(name, accum, n) for name, accum, n, _ in misfits}
    return {
        "estimated": True, "model": args.model, "workload": spec.workload, "seq_len": spec.seq_len,
        "micro_batch": spec.micro_batch, "precision": args.precision, "adamw": args.adamw,
        "params": shape.params,
        "trainable": shape.trainable, "activation_bytes": activations, "activation_source": source,
        "device_memory_gib": args.device_memory_gib,
        "not_planned": _not_planned(args),
        "plans": [{"strategy": name, "grad_accum": accum,
                   "fits_from": (plan.fits_from(by_n, args.device_memory_gib * GIB)
                                 if args.device_memory_gib else None),
                   "world_sizes": {str(n): {"total_bytes": e.total, "moment": e.moment,
                                            "terms": [{"name": t.name, "bytes": t.bytes, "formula": t.formula}
                                                      for t in e.terms],
                                            **({"reference": {**ref[n], "error": references.error(e, ref[n])}}
                                               if ref else {}),
                                            **({**predicted[(name, accum)][n].as_json(),
                                                "fits_device": (name, accum, n) not in unfit}
                                               if (name, accum) in predicted else {})}
                                   for n, e in by_n.items()}}
                  for name, accum, by_n, ref in rows],
        "step_times": [{"strategy": name, "grad_accum": accum, "mfu": args.mfu,
                        "peak_tflops": args.peak_tflops,
                        "world_sizes": {str(n): mfu_cli.time_json(t, sources[n]) for n, t in by_n.items()}}
                       for name, accum, by_n, sources in times]}


if __name__ == "__main__":
    sys.exit(main())
