"""The memory planner (pytest_llmbench/plan.py) against references others wrote, at full size:

    fsdp           PyTorch's FSDPMemTracker running the real architecture under FakeTensorMode on the
                   "fake" process group at N (harness/memref.py): states and total at its peak
    zero2, zero3   DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (16-bit training, the widths
                   they assume): the planner's terms at precision bf16, without the buckets and
                   gathered parameters those estimators leave out (zero3: with its largest layer),
                   outside the optimizer step / inside it (its flat fp32 gradient copy)
    ddp            closed form, no reference beyond DDP's logging data (tests/unit/test_plan.py)

    .venv/bin/python benchmarks/plan_references.py [--models mistral-7b,llama3-8b]
        [--world-sizes 8,64,256] [--grad-accum 1,2] [--seq-len 2048] > table.md

Prints a markdown table; ~25 s per FSDP row on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from harness import memref  # noqa: E402
from harness.spec import RunSpec  # noqa: E402
from pytest_llmbench import plan  # noqa: E402

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mistral-7b,llama3-8b")
    parser.add_argument("--world-sizes", default="8,64,256")
    parser.add_argument("--grad-accum", default="1,2")
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    sizes = [int(x) for x in args.world_sizes.split(",")]
    accums = [int(x) for x in args.grad_accum.split(",")]
    print("| model | strategy | N | grad_accum | reference | reference states GiB | planner states GiB | "
          "states error | reference total GiB | planner total GiB | total error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        spec = RunSpec.from_preset(model, seq_len=args.seq_len, micro_batch=1).replace(strategy="fsdp")
        shape = plan.Shape.of(spec)
        act = memref.activation_peak_by_depth(spec)
        for n in sizes:
            ds = memref.deepspeed_estimates(shape.params, shape.largest_layer, n)
            for strategy in ("zero2", "zero3"):  # outside the optimizer step / inside it
                mine = plan.deepspeed_counted(strategy, shape, n)
                errors = " / ".join(f"{m / ds[strategy] - 1:+.1%}" for m in mine)
                print(f"| {model} | {strategy} | {n} | any | DeepSpeed estimator (16-bit) | "
                      f"{ds[strategy] / GIB:.2f} | {' / '.join(f'{m / GIB:.2f}' for m in mine)} | {errors} "
                      f"| - | - | - |")
            for accum in accums:
                start = time.time()
                ref = memref.fsdp_peak(spec.replace(world_size=n, grad_accum=accum))
                est = plan.estimate("fsdp", shape, n, grad_accum=accum, activations=act,
                                    foreach=False)  # the reference runs AdamW's for-loop
                ref_states = ref["total"] - ref["activation"] - ref["temp"]
                states_error, total_error = est.states / ref_states - 1, est.total / ref["total"] - 1
                print(f"| {model} | fsdp | {n} | {accum} | FSDPMemTracker ({time.time() - start:.0f} s) | "
                      f"{ref_states / GIB:.2f} | {est.states / GIB:.2f} | {states_error:+.1%} | "
                      f"{ref['total'] / GIB:.2f} | {est.total / GIB:.2f} | {total_error:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
