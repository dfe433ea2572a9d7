"""The memory planner's state terms (pytest_llmbench/plan.py) against what PyTorch's own tracker
measures in real runs of every strategy (--llmbench-memory, harness/memtrack.py), per world size
and grad_accum:

    .venv/bin/python benchmarks/memory_categories.py [--model gpt2-124m] [--world-sizes 1,2,4]
        [--grad-accum 1,2] [--strategies ddp,fsdp,zero2,zero3] [--seq-len 32] > table.md

Each case runs on the local launcher (warm ranks, CPU/gloo, one core per rank): one warm-up step, one
measured step, then one step under the tracker. Rank 0's categories at its peak are set beside the
planner's term that means the same tensors (``PAIRS``); what DeepSpeed's optimizer made before the
tracker started is read off it (``held_bytes``). MemTracker files every tensor made inside the
optimizer's step as optimizer state, its temporaries too: where the peak falls in the step (ZeRO-3
at N=1, whose one flat partition makes AdamW's temporaries partition-sized) "optimizer" holds more
than the moments. Prints a markdown table and the largest error; exits 1 when a pair is off by more
than 5% (issue 22's bar). Tensors are counted, not pages, so the size of
the model only changes how much there is to count; a preset above DeepSpeed's 50M-element reduce
bucket (gpt2-124m) makes its buckets fill.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from harness.spec import RunSpec  # noqa: E402
from pytest_llmbench import plan  # noqa: E402
from pytest_llmbench.launchers import warm  # noqa: E402
from pytest_llmbench.launchers.local import LocalLauncher  # noqa: E402

MIB = 2**20
BAR = 0.05


def pairs(strategy: str, world_size: int, grad_accum: int) -> list[tuple[str, str, str]]:
    """(label, planner term, where the measurement is: "peak:<categories>" or "held:<name>") for the
    tensors both mean. Gradients are paired where the tracker's peak holds all of them: DDP at
    grad_accum 2 (no_sync keeps them in .grad), FSDP2's unsharded ones under no_sync."""
    out = [("optimizer", "optimizer", "peak:optstate")]
    if strategy == "ddp":
        out += [("weights", "weights", "peak:parameter")]
        if grad_accum > 1:
            out += [("gradients", "gradients", "peak:gradient")]
    elif strategy == "fsdp":
        out += [("weights", "weights", "peak:sharded_param")]
        if grad_accum > 1 and world_size > 1:
            out += [("gradients", "gradients", "peak:unsharded_grad")]
    elif strategy == "zero2":
        out += [("weights", "weights", "peak:parameter"),
                ("master copy", "master copy", "held:master_copy")]
    elif strategy == "zero3":
        out += [("weight shard", "weights", "held:weight_shard"),
                ("master copy", "master copy", "held:master_copy"),
                ("gradient partition", "gradients", "held:gradient_partition")]
    return out


def measured(categories: dict, where: str) -> float:
    kind, _, names = where.partition(":")
    source = categories["peak_bytes"] if kind == "peak" else categories.get("held_bytes", {})
    return float(sum(source.get(name, 0) for name in names.split("+")))


def case(model: str, strategy: str, n: int, accum: int, args, pools: warm.Pools, root: Path) -> list[str]:
    """One real run of the case; its table rows, each ending in its error (None: the run failed)."""
    spec = RunSpec.from_preset(model, strategy=strategy, world_size=n, grad_accum=accum,
                               seq_len=args.seq_len, micro_batch=args.micro_batch, steps=2, warmup_steps=1,
                               compute_probe_steps=0, memory_steps=1, threads_per_rank=1, data_pool=4)
    run_dir = root / f"{strategy}-{n}-{accum}"
    result = LocalLauncher(pools=pools).run(spec, run_dir=run_dir, run_id=run_dir.name, timeout_s=900,
                                            env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    head = f"| {model} | {strategy} | {n} | {accum} |"
    if not result.ok:
        return [(f"{head} failed: {result.describe_failure()[:200]} | | | | |", None)]
    categories = result.per_rank[0]["memory_categories"]
    terms = plan.estimate(strategy, plan.Shape.of(spec), n, grad_accum=accum).by_category()
    buckets = ""
    if strategy.startswith("zero"):  # the one the gradients view, and ZeRO-2's second, a temporary
        peak = categories["peak_bytes"]
        seen = peak.get("gradient", 0) + (peak.get("temp", 0) if strategy == "zero2" else 0)
        buckets = f"{seen / MIB:.2f} / {terms['grad buckets'] / MIB:.2f}"
    rows = []
    for label, term, where in pairs(strategy, n, accum):
        mine, theirs = terms.get(term, 0.0), measured(categories, where)
        error = (mine - theirs) / theirs if theirs else float("inf")
        rows.append((f"{head} {label} | {theirs / MIB:.2f} | {mine / MIB:.2f} | {error:+.1%} | {buckets} |",
                     error))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-124m")
    parser.add_argument("--strategies", default="ddp,fsdp,zero2,zero3")
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--grad-accum", default="1,2")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=1)
    args = parser.parse_args()
    grid = itertools.product(args.strategies.split(","), [int(x) for x in args.world_sizes.split(",")],
                             [int(x) for x in args.grad_accum.split(",")])
    print("| model | strategy | N | grad_accum | term | measured MiB | planner MiB | error | "
          "DeepSpeed buckets measured / planned MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    pools, worst, started = warm.Pools(), 0.0, time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as root:
            for strategy, n, accum in grid:
                for row, error in case(args.model, strategy, n, accum, args, pools, Path(root)):
                    print(row, flush=True)
                    worst = max(worst, float("inf") if error is None else abs(error))
    finally:
        pools.close_all()
    print(f"\nlargest error {worst:.1%} (bar {BAR:.0%}); {time.perf_counter() - started:.0f} s")
    return 0 if worst <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
