"""Where does a case's wall time go, outside the steps it measures?

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 3] [--steps 20] [--strategies ddp,zero2]

For each strategy: the tiny preset on 2 CPU ranks through the local launcher (the path
``pytest -m cpu`` takes), split into time in warm-up and measured steps, the compute-only
probe (a measurement of its own), and launch overhead (the rest), with the harness's own
set-up phases. Then the floors no harness can go
under on this host, each timed as a 2-rank torchrun:

    torchrun-only        ``torchrun --no-python true``: the launcher's own start-up
    + import torch       each rank imports torch and exits
    + process group      ... and joins a gloo process group (rendezvous), then leaves
    + import deepspeed   ... what a ZeRO rank pays on top

Goals (issue 3): under 8 s for DDP/FSDP and under 10 s for ZeRO.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.spec import RunSpec
from pytest_llmbench.launchers.local.launcher import LocalLauncher

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
FLOORS = {
    "torchrun-only": ["--no-python", "true"],
    "+ import torch": ["-m", "torch.version"],
    "+ process group": ["--no-python", sys.executable, "-c",
                        "import torch.distributed as d; d.init_process_group('gloo'); "
                        "d.barrier(); d.destroy_process_group()"],
    "+ import deepspeed": ["--no-python", sys.executable, "-c",
                           "import torch.distributed as d; import deepspeed; d.init_process_group('gloo'); "
                           "d.barrier(); d.destroy_process_group()"],
}


def floor(args: list[str]) -> float:
    started = time.monotonic()
    subprocess.run([*TORCHRUN, *args], check=True, cwd=ROOT, capture_output=True,
                   env={**os.environ, "DS_ACCELERATOR": "cpu"})
    return time.monotonic() - started


def case(strategy: str, steps: int, workdir: Path, i: int) -> dict:
    spec = RunSpec.from_preset("tiny", strategy=strategy, world_size=2, threads_per_rank=1,
                               steps=steps, warmup_steps=3)
    result = LocalLauncher().run(spec, run_dir=workdir / f"{strategy}-{i}", run_id=f"{strategy}{i}",
                                 timeout_s=600, env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    assert result.ok, result.describe_failure()
    steps_s = sum(result.warmup_step_times_s) + sum(result.step_times_s)
    return {"wall_s": result.wall_time_s, "overhead_s": result.metrics["launch_overhead_s"],
            "steps_s": steps_s, **result.phases_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--strategies", default="ddp,fsdp,fsdp1,zero2,zero3")
    args = parser.parse_args()
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        runs = {s: [case(s, args.steps, Path(tmp), i) for i in range(args.repeats)]
                for s in args.strategies.split(",")}
    print(f"tiny preset, 2 CPU ranks, {args.steps} steps; median of {args.repeats} runs (seconds)\n")
    print(f"{'strategy':<9} {'wall':>6} {'in steps':>9} {'probe':>6} {'overhead':>9} {'init pg':>8} "
          f"{'build+wrap':>11}  goal")
    for strategy, rows in runs.items():
        m = {key: med(r[key] for r in rows) for key in rows[0]}
        goal = 10.0 if strategy.startswith("zero") else 8.0
        verdict = "met" if m["overhead_s"] < goal else "MISSED"
        print(f"{strategy:<9} {m['wall_s']:6.2f} {m['steps_s']:9.2f} {m['compute_probe_s']:6.2f} "
              f"{m['overhead_s']:9.2f} {m['init_process_group_s']:8.2f} {m['build_and_wrap_s']:11.2f}  "
              f"< {goal:g} {verdict}")
    print("\nfloors: a 2-rank torchrun doing only this (median seconds)")
    for name, cmd in FLOORS.items():
        print(f"  {name:<20} {med(floor(cmd) for _ in range(args.repeats)):6.2f}")


if __name__ == "__main__":
    main()
