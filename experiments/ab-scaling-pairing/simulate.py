"""The scaling floor in an A/B session under drift (issue 66): false alarms when each ws2 round pairs
with the ws1 round of the same index run in the ws1 case's own test minutes earlier (before), and with
a ws1 run beside it in the same round, before or after it in alternate rounds (now,
``runner.Runner._beside_its_baseline``). The verdict is the
project's own ``trials.efficiency_check`` on drawn results.

    .venv/bin/python experiments/ab-scaling-pairing/simulate.py > experiments/ab-scaling-pairing/output.txt

A session: the ws1 test runs R rounds (candidate and baseline side: 2 launches a round), then the ws2
test runs R rounds (before: 2 launches a round; now: 3, ws1 beside ws2, before it in odd rounds and after
it in even ones). Every launch's tokens/s is
its truth x the machine's speed at that launch x launch noise (log-normal, cv 5%). The case's true
efficiency is exactly at the floor (0.8), so a gate at its budget fails at most alpha (2%) of the time.
Machine speed: flat; a linear drift of 1% a launch; a burner that starts at a random launch and
slows it 20%; a random walk of 2% a launch.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.result import BenchResult  # noqa: E402
from pytest_llmbench import trials  # noqa: E402
from pytest_llmbench.store import read_file  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "store" / "results"
WS1, WS2 = (read_file(next(DATA.glob(f"*/tinycpu-ddp-ws{n}-seq64.json")))[1] for n in (1, 2))
FLOOR, ALPHA, CV, ROUNDS = 0.8, 0.02, 0.05, 4


def speeds(rng: random.Random, kind: str, launches: int) -> list[float]:
    if kind == "flat":
        return [1.0] * launches
    if kind == "linear 1%/launch":
        return [0.99 ** t for t in range(launches)]
    if kind == "burner -20% from a random launch":
        start = rng.randrange(launches)
        return [0.8 if t >= start else 1.0 for t in range(launches)]
    speed, out = 1.0, []
    for _ in range(launches):
        out.append(speed)
        speed *= math.exp(rng.gauss(0, 0.02))
    return out


def result(base: BenchResult, k: int, tokens: float) -> BenchResult:
    return base.replace(trial=k, run_id=f"{base.case_id}-t{k}",
                        metrics={**base.metrics, "tokens_per_s": tokens})


def session(rng: random.Random, kind: str, beside: bool) -> bool:
    """One session's floor verdict on ws2: True when it failed (a false alarm: the truth is the floor)."""
    per_round = 3 if beside else 2
    speed = speeds(rng, kind, 2 * ROUNDS + per_round * ROUNDS)
    noise = lambda: math.exp(rng.gauss(0, CV))  # noqa: E731
    at_1 = [result(WS1, r + 1, 1000 * speed[2 * r] * noise()) for r in range(ROUNDS)]  # the ws1 test
    t0 = 2 * ROUNDS
    if beside:  # each ws2 round: ws1 then ws2 in odd rounds, ws2 then ws1 in even ones, then the other side
        first = [t0 + 3 * r + (r % 2) for r in range(ROUNDS)]  # round r + 1's ws1 launch
        at_1 = [result(WS1, r + 1, 1000 * speed[first[r]] * noise()) for r in range(ROUNDS)]
        at_2 = [result(WS2, r + 1, 2 * FLOOR * 1000 * speed[t0 + 3 * r + 1 - (r % 2)] * noise())
                for r in range(ROUNDS)]
    else:
        at_2 = [result(WS2, r + 1, 2 * FLOOR * 1000 * speed[t0 + 2 * r] * noise()) for r in range(ROUNDS)]
    return trials.efficiency_check(at_2, at_1, FLOOR, noise_cv=CV, alpha=ALPHA).outcome == "fail"


def main(draws: int = 4000) -> None:
    print(f"scaling floor {FLOOR} at the truth, {ROUNDS} rounds, launch cv {CV:.0%}, alpha {ALPHA:.0%}: "
          f"false alarms over {draws} sessions")
    for kind in ("flat", "linear 1%/launch", "burner -20% from a random launch", "random walk 2%/launch"):
        rng = random.Random(kind)
        before = sum(session(rng, kind, False) for _ in range(draws)) / draws
        now = sum(session(rng, kind, True) for _ in range(draws)) / draws
        print(f"  {kind:34s} before (rounds minutes apart) {before:6.1%}   now (beside it) {now:6.1%}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
