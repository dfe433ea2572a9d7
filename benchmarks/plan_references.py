"""The memory planner (pytest_llmbench/planner/memory.py) against references others wrote, at full size:

    fsdp           PyTorch's FSDPMemTracker running the real architecture under FakeTensorMode on the
                   "fake" process group at N (planner/memref.py fsdp_peak), fp32: states (total less
                   activations and temporaries) and total at its peak
    zero2, zero3   DeepSpeed's own engine, exactly as harness/parallel/deepspeed.py builds it, under
                   FakeTensorMode on the "fake" process group at N, as the fullest rank, with
                   PyTorch's MemTracker (memref.deepspeed_peak), in bf16 (DeepSpeed's bf16 section, as
                   its users run it): states as the client AdamW starts its fullest group's step
                   (every model state of the step alive, activations gone) against the planner's
                   optimizer moment, and the peak total against the planner's larger moment; and
                   DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (16-bit training, the widths
                   they assume): the planner's terms at precision bf16, without the buckets and
                   gathered parameters those estimators leave out (zero3: with its largest layer),
                   outside the optimizer step / inside it (its flat fp32 gradient copy)
    ddp            closed form, no reference beyond DDP's logging data (tests/unit/test_plan.py)

    .venv/bin/python benchmarks/plan_references.py [--models mistral-7b,llama3-8b]
        [--strategies fsdp,zero2,zero3] [--world-sizes 8,64,256] [--grad-accum 1,2]
        [--seq-len 2048] > table.md

Prints a markdown table. On 2 CPU cores: ~30-80 s per FSDP row; a DeepSpeed engine row 1.5-5 min,
ZeRO-3 at N 64-256 7-49 min (DeepSpeed partitions parameter by parameter for N ranks).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from harness import strategies  # noqa: E402
from harness.spec import RunSpec  # noqa: E402
from pytest_llmbench.planner import memory as plan  # noqa: E402
from pytest_llmbench.planner import memref  # noqa: E402

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mistral-7b,llama3-8b")
    parser.add_argument("--strategies", default="fsdp,zero2,zero3")
    parser.add_argument("--world-sizes", default="8,64,256")
    parser.add_argument("--grad-accum", default="1,2")
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    sizes = [int(x) for x in args.world_sizes.split(",")]
    accums = [int(x) for x in args.grad_accum.split(",")]
    chosen = args.strategies.split(",")
    print("| model | strategy | N | grad_accum | reference | reference states GiB | planner states GiB | "
          "states error | reference total GiB | planner total GiB | total error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        spec = RunSpec.from_preset(model, seq_len=args.seq_len, micro_batch=1).replace(strategy="fsdp")
        shape = plan.Shape.of(spec)
        act = memref.activation_peak_by_depth(spec) if "fsdp" in chosen else 0
        # DeepSpeed's bf16 section: bf16 parameters, so bf16 activations (memref.activation_peak)
        act16 = (memref.activation_peak_by_depth(spec.replace(strategy="zero2", dtype="bf16"))
                 if {"zero2", "zero3"} & set(chosen) else 0)
        for n in sizes:
            ds = memref.deepspeed_estimates(shape.params, shape.largest_layer, n)
            for strategy in [s for s in ("zero2", "zero3") if s in chosen]:
                mine = plan.deepspeed_counted(strategy, shape, n)  # outside the optimizer step / inside it
                errors = " / ".join(f"{m / ds[strategy] - 1:+.1%}" for m in mine)
                print(f"| {model} | {strategy} | {n} | any | DeepSpeed estimator (16-bit) | "
                      f"{ds[strategy] / GIB:.2f} | {' / '.join(f'{m / GIB:.2f}' for m in mine)} | {errors} "
                      f"| - | - | - |")
                for accum in accums:
                    start = time.time()
                    ref = memref.deepspeed_peak(spec.replace(strategy=strategy, world_size=n,
                                                             grad_accum=accum, dtype="bf16"),
                                                strategies.get(strategy))
                    _, step = plan.moments(strategy, shape, n, grad_accum=accum, activations=act16,
                                           precision="bf16", foreach=False)  # as the reference
                    est = plan.estimate(strategy, shape, n, grad_accum=accum, activations=act16,
                                        precision="bf16", foreach=False)
                    _row(model, strategy, n, accum, f"DeepSpeed engine, bf16 ({time.time() - start:.0f} s)",
                         ref["step:total"], step.states, ref["total"], est.total)
            if "fsdp" not in chosen:
                continue
            for accum in accums:
                start = time.time()
                ref = memref.fsdp_peak(spec.replace(world_size=n, grad_accum=accum), strategies.get("fsdp"))
                est = plan.estimate("fsdp", shape, n, grad_accum=accum, activations=act,
                                    foreach=False)  # the reference runs AdamW's for-loop
                _row(model, "fsdp", n, accum, f"FSDPMemTracker ({time.time() - start:.0f} s)",
                     ref["total"] - ref["activation"] - ref["temp"], est.states, ref["total"], est.total)


def _row(model: str, strategy: str, n: int, accum: int, reference: str, ref_states: float, states: float,
         ref_total: float, total: float) -> None:
    print(f"| {model} | {strategy} | {n} | {accum} | {reference} | {ref_states / GIB:.2f} | "
          f"{states / GIB:.2f} | {states / ref_states - 1:+.1%} | {ref_total / GIB:.2f} | "
          f"{total / GIB:.2f} | {total / ref_total - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
