"""How often ``--llmbench-bisect`` names the right commit on a noisy runner (issue 66), with the project's
own functions: every step's A/B rounds go through ``gates.sequential`` (the gate's looks, alpha spending,
confirming block), the step is judged by ``bisect.judged`` from verdicts shaped as the session stores
them (``gates.verdicts_json``), and the search is ``bisect.search``. Only the rounds are drawn here.

    .venv/bin/python experiments/bisect-noise/simulate.py 500 > experiments/bisect-noise/output.txt

The runner, per launch (each side of each round is one launch of the case):
- tokens/s = truth x exp(N(0, cv)) x drift x burner;
- drift: a random walk over the rounds (sd cv/2 a round), shared by both launches of a round;
- a burner (another job on the machine) in half the steps of the rows that say so, starting at a
  random round and staying: from then on each launch is slowed by its own U(0, 30%) draw (the
  machine's share it lost to the burner varies launch to launch), so it adds spread and, in the round
  it starts, bias.
One case, one gate (tokens_per_s, 5% allowed), the session's whole 2% budget on it (budget.Budget with one
case gate), rounds 4..32 as the defaults; an undecided step's second try runs to 64 (the driver doubles
the cap). A 20% slowdown (0.8) at a random commit of a 4- or 12-commit range. "right": the commit named
is the one that made it. The first column is this search with each step judged by its gate's outcome
alone (as before issue 66, but with skips and second tries; the search before it stopped at the first
undecided step); the second classifies each step by the end it resembles (bisect_search.resembles).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pytest_llmbench import bisect_search, budget, gates  # noqa: E402

ALLOWED = 5.0
ALPHA = budget.Budget(case_gates=1).gate_alpha()


def step(rng: random.Random, truth: float, cv: float, burner: bool, cap: int) -> dict:
    """One A/B session of a commit whose true tokens/s is ``truth`` x the other side's: its verdicts."""
    start = rng.randrange(1, cap + 8) if burner else None
    drift = [0.0]

    def launch(r: int) -> float:
        slowed = 1 - rng.uniform(0, 0.3) if start is not None and r >= start else 1.0
        return math.exp(drift[0] + rng.gauss(0, cv)) * slowed

    def one_round(r: int):
        drift[0] += rng.gauss(0, cv / 2)
        return {"tokens_per_s": truth * launch(r)}, {"tokens_per_s": launch(r)}

    ran = gates.sequential(one_round, [("tokens_per_s", ALLOWED)], first=budget.AB_FIRST, cap=cap,
                           alpha=ALPHA)
    v = ran.verdicts["tokens_per_s"]
    said = {"outcome": v.outcome, "ratio": v.ratio.value, "low": v.ratio.low, "high": v.ratio.high,
            "rounds": ran.rounds}
    return {"cases": {"case": {"tokens_per_s": said}},
            "side_failures": {}, "suite_failures": []}


def bisect_once(rng: random.Random, n: int, cv: float, burners: float, use_effect: bool) -> tuple[bool, int]:
    commits = [f"c{i}" for i in range(n)]
    culprit = rng.randrange(n)
    truth = {c: (0.8 if i >= culprit else 1.0) for i, c in enumerate(commits)}

    def judge(commit: str, against: str, more_rounds: bool = False) -> bisect_search.Step:
        ratio = truth[commit] / truth.get(against, 1.0)
        verdicts = step(rng, ratio, cv, rng.random() < burners, 64 if more_rounds else budget.AB_CAP)
        if not use_effect:  # as it was: the gate's outcome decides, no measured effect to compare with
            outcome, why = bisect_search.judged(verdicts, 0, "")
            return bisect_search.Step(commit, against, outcome, why, 0.0, {})
        return bisect_search.Step(commit, against, *bisect_search.judged(verdicts, 0, ""), 0.0, verdicts)

    found, steps, _ = bisect_search.search(commits, "good", judge)
    return found == commits[culprit], len(steps)


def main(bisects: int) -> None:
    print(f"{bisects} bisects per row, seeded; a 20% slowdown at a random commit; "
          f"gate tokens_per_s:{ALLOWED:g}%, alpha {ALPHA:.3f}")
    print(f"{'runner':<26}{'range':>6}{'right, gates only':>18}{'right, resembles':>18}{'steps (mean)':>14}")
    rows = (("quiet (cv 1%)", 0.01, 0.0), ("cv 5% with a burner", 0.05, 0.5),
            ("cv 15% with a burner", 0.15, 0.5), ("cv 15%, no burner", 0.15, 0.0))
    for label, cv, burners in rows:
        for n in (4, 12):
            row = []
            for use_effect in (False, True):
                rng = random.Random(f"{label}-{n}-{use_effect}")
                runs = [bisect_once(rng, n, cv, burners, use_effect) for _ in range(bisects)]
                row.append((sum(ok for ok, _ in runs) / bisects, sum(s for _, s in runs) / bisects))
            print(f"{label:<26}{n:>6}{row[0][0]:>18.1%}{row[1][0]:>18.1%}{row[1][1]:>14.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
