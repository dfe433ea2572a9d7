"""Warm ranks against one torchrun per case: launch overhead, tokens/s and peak memory.

    .venv/bin/python benchmarks/warm_ranks.py [--rounds 4] [--steps 12] [--strategies ddp,zero2]

Each strategy's tiny preset on 2 CPU ranks through the local launcher, fresh (one torchrun for
the case) and warm (one pool for the whole run, launchers/local/warm.py), interleaved: each round runs
every strategy both ways, fresh first in odd rounds and warm first in even ones (ABBA), so a
drift of the machine falls on both sides alike. Per strategy:

    overhead     launch_overhead_s: wall time outside the steps and the compute-only probe
                 (process start, imports, rendezvous, model build and wrap, teardown); the pool's
                 own start-up is shown once and left out of its first case
    tokens/s     warm / fresh, 95% paired interval over the rounds (stats.paired_ratio_interval)
    peak memory  warm / fresh peak resident memory, the same interval

Goal (issue 25): overhead at most 1 s per case warm on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from harness.spec import RunSpec
from pytest_llmbench.launchers.local import warm
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from pytest_llmbench.stats import paired_ratio_interval

GOAL_S = 1.0


def run(launcher: LocalLauncher, strategy: str, steps: int, folder: Path) -> dict:
    spec = RunSpec.from_preset("tiny", strategy=strategy, world_size=2, threads_per_rank=1,
                               steps=steps, warmup_steps=3)
    result = launcher.run(spec, run_dir=folder, run_id=folder.name, timeout_s=600,
                          env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    assert result.ok, result.describe_failure()
    overhead = result.metrics["launch_overhead_s"]
    if result.launch.get("case_index") == 0:
        overhead -= result.launch["pool_start_s"]  # paid once per pool, shown on its own
    return {"overhead_s": overhead, "tokens_per_s": result.metrics["tokens_per_s"],
            "peak_gib": result.metrics["peak_memory_gib"], "launch": result.launch}


def interval(pairs: list[tuple[float, float]]) -> str:
    ratio = paired_ratio_interval(pairs)
    if ratio.low is None:
        return f"{ratio.value:.3f}"
    verdict = "same" if ratio.low <= 1 <= ratio.high else ("higher" if ratio.low > 1 else "lower")
    return f"{ratio.value:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--strategies", default="ddp,fsdp,fsdp1,zero2,zero3")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    pools = warm.Pools()
    launchers = {"fresh": LocalLauncher(), "warm": LocalLauncher(pools=pools)}
    runs: dict[tuple[str, str], list[dict]] = {(s, m): [] for s in strategies for m in launchers}
    pool_start = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = ("fresh", "warm") if r % 2 == 0 else ("warm", "fresh")
                for strategy in strategies:
                    for mode in order:
                        row = run(launchers[mode], strategy, args.steps, Path(tmp) / f"{mode}-{strategy}-{r}")
                        runs[strategy, mode].append(row)
                        if row["launch"].get("case_index") == 0:
                            pool_start.append(row["launch"]["pool_start_s"])
    finally:
        pools.close_all()
    med = statistics.median
    print(f"tiny preset, 2 CPU ranks, {args.steps} steps, {args.rounds} rounds interleaved (ABBA); "
          f"pool start-up {', '.join(f'{s:.2f}' for s in pool_start)} s, once per pool\n")
    print(f"{'strategy':<9} {'overhead fresh':>15} {'overhead warm':>14}  {'goal':<10} "
          f"{'tokens/s warm/fresh (95%)':<32} peak memory warm/fresh (95%)")
    for strategy in strategies:
        fresh, hot = runs[strategy, "fresh"], runs[strategy, "warm"]
        over_fresh, over_warm = med(r["overhead_s"] for r in fresh), med(r["overhead_s"] for r in hot)
        goal = f"<= {GOAL_S:g} {'met' if over_warm <= GOAL_S else 'MISSED'}"
        tokens = interval([(w["tokens_per_s"], f["tokens_per_s"]) for w, f in zip(hot, fresh, strict=True)])
        memory = interval([(w["peak_gib"], f["peak_gib"]) for w, f in zip(hot, fresh, strict=True)])
        print(f"{strategy:<9} {over_fresh:15.2f} {over_warm:14.2f}  {goal:<10} {tokens:<32} {memory}")
    print("\noverhead: median seconds per case; warm/fresh: ratio of means, 95% paired t-interval of "
          "the log ratio over the rounds; same = the interval holds 1")


if __name__ == "__main__":
    main()
