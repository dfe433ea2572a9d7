"""Is the harness what it measures? Harness DDP vs the bare loop, same case, interleaved.

    .venv/bin/python benchmarks/compare_bare_loop.py [--repeats 5] [--steps 30]

Runs ``bare_loop.py`` and the harness (local launcher) alternately on 2 ranks with the
tiny preset and prints the median tokens/s of each and their ratio (goal: >= 0.97).
"""
import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.spec import RunSpec
from pytest_llmbench.launchers.local.launcher import LocalLauncher

ROOT = Path(__file__).resolve().parent.parent


def bare(settings: dict) -> float:
    args = [f"{k}={v}" for k, v in settings.items()]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(ROOT / "benchmarks" / "bare_loop.py"), *args], capture_output=True, text=True,
                         cwd=ROOT)
    found = re.search(r"BARE tokens_per_s=([\d.]+)", out.stdout)
    if out.returncode != 0 or not found:
        sys.exit(f"bare loop failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return float(found[1])


def harness(settings: dict, workdir: Path, i: int) -> float:
    spec = RunSpec.from_preset("tiny", strategy="ddp", world_size=2, threads_per_rank=1, **settings)
    result = LocalLauncher().run(spec, run_dir=workdir / f"h{i}", run_id=f"h{i}", timeout_s=600, env={},
                                 progress=lambda _: None)
    assert result.ok, result.describe_failure()
    return result.metrics["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    settings = dict(steps=args.steps, warmup_steps=5, micro_batch=8, grad_accum=2, seq_len=128)
    bares, harnesses = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            bares.append(bare(settings))
            harnesses.append(harness(settings, Path(tmp), i))
            print(f"run {i + 1}: bare {bares[-1]:,.0f} tok/s, harness {harnesses[-1]:,.0f} tok/s", flush=True)
    b, h = statistics.median(bares), statistics.median(harnesses)
    print(f"median bare loop  {b:,.0f} tokens/s")
    print(f"median harness    {h:,.0f} tokens/s")
    print(f"harness / bare    {h / b:.3f}  (goal >= 0.97)")


if __name__ == "__main__":
    main()
