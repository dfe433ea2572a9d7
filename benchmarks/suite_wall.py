"""The README's main suite, fresh and warm, side by side: wall time against time in steps.

    .venv/bin/python benchmarks/suite_wall.py [-- extra pytest arguments]

Runs ``pytest tests/benchmarks -m auto`` (what ``make bench`` runs) twice in one go, first with
``--llmbench-fresh`` (one torchrun per case), then on warm ranks (the default), each into a
folder of its own, and reads every stored result back:

    wall        pytest's whole run, as a user waits for it
    in steps    warm-up and measured steps plus the compute-only probes (and the collectives
                probes' timed iterations): the time spent measuring
    wall / in steps, and the launch overhead of the cases (median, seconds)

Goal (issue 25): warm, the suite's wall at most 1.2x its time in steps and probes.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.result import BenchResult
from pytest_llmbench.store import ResultStore

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2


def suite(output: Path, extra: list[str]) -> tuple[float, list[BenchResult]]:
    cmd = [sys.executable, "-m", "pytest", "tests/benchmarks", "-m", "auto", f"--llmbench-output={output}",
           "-p", "no:cacheprovider", "-q", *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return wall, [result for _, result in ResultStore(output).load_all()]


def in_steps(result: BenchResult) -> float:
    timed = sum(result.warmup_step_times_s) + sum(result.step_times_s)
    return timed + result.phases_s.get("compute_probe_s", sum(result.compute_only_step_times_s))


def main() -> None:
    extra = sys.argv[1:]
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmbench-suite-wall-") as tmp:
        for mode, flags in (("fresh", ["--llmbench-fresh"]), ("warm", [])):
            wall, results = suite(Path(tmp) / mode, flags + extra)
            steps = sum(in_steps(r) for r in results)
            overhead = statistics.median(r.metrics["launch_overhead_s"] for r in results
                                         if r.metrics.get("launch_overhead_s") is not None)
            pools = {r.launch.get("pool") for r in results if r.launch.get("mode") == "warm"}
            rows.append((mode, len(results), wall, steps, overhead, len(pools)))
    print(f"pytest tests/benchmarks -m auto {' '.join(extra)}".rstrip())
    print(f"{'mode':<6} {'cases':>5} {'wall s':>8} {'in steps s':>11} {'wall/steps':>11} "
          f"{'overhead p50 s':>15} {'pools':>6}  goal")
    for mode, cases, wall, steps, overhead, pools in rows:
        goal = f"<= {GOAL:g} {'met' if wall / steps <= GOAL else 'MISSED'}" if mode == "warm" else ""
        print(f"{mode:<6} {cases:5d} {wall:8.1f} {steps:11.1f} {wall / steps:11.2f} {overhead:15.2f} "
              f"{pools:6d}  {goal}")


if __name__ == "__main__":
    main()
