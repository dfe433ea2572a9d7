"""What a Slurm case costs over a local one, on this host.

    .venv/bin/python benchmarks/slurm_overhead.py [--repeats 3]

Starts the two-node local Slurm cluster (tools/slurm_local.py; needs root, slurm-wlm and munge),
then runs the same case (tiny GPT, DDP, 2 ranks, 5 steps) with the local launcher, as a Slurm
batch job on one node and on two nodes, and as a step of an allocation (salloc), in rounds, each
launcher once per round. Prints the median wall time of each and its difference to local: what
submission, scheduling, srun and the rendezvous through the run folder add. The steps themselves
are the same work everywhere (their time is printed too).
"""

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.spec import RunSpec
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from pytest_llmbench.launchers.slurm.launcher import SlurmLauncher

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(micro_batch=4, grad_accum=2, seq_len=64, steps=5, warmup_steps=2, threads_per_rank=1,
            compute_probe_steps=2, lr=3e-3, data_pool=16, world_size=2)


def _cluster_tool():
    spec = importlib.util.spec_from_file_location("slurm_local", ROOT / "tools" / "slurm_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))  # still stop the cluster
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = _cluster_tool().LocalCluster(root / "cluster").start()
        os.environ.update(cluster.env)
        allocation = ""
        try:
            ways = {"local": (LocalLauncher(), 1, False), "slurm batch, 1 node": (SlurmLauncher(), 1, False),
                    "slurm batch, 2 nodes": (SlurmLauncher(), 2, False),
                    "slurm step, 2 nodes": (SlurmLauncher(), 2, True)}
            walls = {name: [] for name in ways}
            steps = {name: [] for name in ways}
            for round_ in range(args.repeats):
                for name, (launcher, nnodes, in_allocation) in ways.items():
                    os.environ.pop("SLURM_JOB_ID", None)
                    if in_allocation:  # its own allocation, granted before the clock starts
                        out = subprocess.run(["salloc", "--no-shell", "-N2"], capture_output=True, text=True,
                                             timeout=60)
                        allocation = next(w for w in out.stderr.split() if w.isdigit())
                        os.environ["SLURM_JOB_ID"] = allocation
                    spec = RunSpec.from_preset("tiny", **{**TINY, "nnodes": nnodes})
                    run_id = f"overhead-{round_}-{len(walls[name])}-{name.replace(' ', '').replace(',', '')}"
                    started = time.monotonic()
                    result = launcher.run(spec, run_dir=root / run_id, run_id=run_id, timeout_s=120,
                                          env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
                    if not result.ok:
                        raise SystemExit(f"{name}: {result.describe_failure()}")
                    walls[name].append(time.monotonic() - started)
                    steps[name].append(sum(result.step_times_s) + sum(result.warmup_step_times_s))
                    if allocation:
                        subprocess.run(["scancel", allocation], timeout=30)
                        allocation = ""
        finally:
            os.environ.pop("SLURM_JOB_ID", None)
            if allocation:
                subprocess.run(["scancel", allocation], timeout=30)
            cluster.stop()
    base = statistics.median(walls["local"])
    print(f"{'launcher':24} {'wall s (median)':>16} {'vs local s':>11} {'steps s':>8}   all walls")
    for name in ways:
        wall = statistics.median(walls[name])
        print(f"{name:24} {wall:16.1f} {wall - base:+11.1f} {statistics.median(steps[name]):8.2f}   "
              + ", ".join(f"{w:.1f}" for w in walls[name]))


if __name__ == "__main__":
    main()
