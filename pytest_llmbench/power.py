"""What an A/B gate can resolve: its power with the confirming block included (a failure stands only once
a block of more rounds confirms it: budget.confirmed), the plan line printed before any round, and the
first look's calibration of this host (its measured noise, what the gate can resolve at it, and when it
cannot, how many rounds it would take). tests/unit/test_gates.py holds the stated power to the gate's own
simulated power at launch noise cv 5% and 15%.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics

from pytest_llmbench import budget, gate_rules, stats
from pytest_llmbench.budget import worse_allowed
from pytest_llmbench.cases import Case


def confirm_power(sd: float, drop: float, block: int) -> float:
    """The chance a confirming block of ``block`` rounds confirms a true ``drop`` (its one-sided
    budget.CONFIRM_LEVEL t upper bound below 1) at a paired log-ratio spread ``sd``: a noncentral t tail."""
    from scipy.stats import nct

    if block < 2 or sd <= 0:
        return 1.0 if sd <= 0 and drop > 0 else 0.0
    delta = -math.log1p(-drop) * math.sqrt(block) / sd
    return float(nct.sf(stats.t_quantile(budget.CONFIRM_LEVEL, block - 1), block - 1, delta))


def gate_power(sd: float, drop: float, allowed_drop: float, points: list[int], alpha: float,
               block: int) -> float:
    """The chance the A/B gate fails a true ``drop`` by its last look AND its confirming block of ``block``
    rounds confirms it, at a paired log-ratio spread ``sd``: the last look's (its share of ``alpha``,
    noncentral t; the earlier looks' shares are nearly nothing, ``spend``) times the block's."""
    from scipy.stats import nct

    n, share = points[-1], budget.spend(alpha, points)[-1]
    if n < 2 or share <= 0:
        return 0.0
    delta = (math.log1p(-allowed_drop) - math.log1p(-drop)) * math.sqrt(n) / sd
    return float(nct.sf(stats.t_quantile(1 - share, n - 1), n - 1, delta)) * confirm_power(sd, drop, block)


def drop_caught(sd: float, allowed_drop: float, points: list[int], alpha: float, block: int,
                power: float = gate_rules.POWER) -> float | None:
    """The true drop ``gate_power`` catches ``power`` of the time (bisection), None when even a 95% drop
    is not: what the gate can resolve at this spread within its cap, confirming block included."""
    low, high = allowed_drop, 0.95
    if gate_power(sd, high, allowed_drop, points, alpha, block) < power:
        return None
    for _ in range(40):
        mid = (low + high) / 2
        caught = gate_power(sd, mid, allowed_drop, points, alpha, block) >= power
        low, high = (low, mid) if caught else (mid, high)
    return high


def rounds_plan(case: Case, gated: list[tuple[str, float]], points: list[int], alpha: float) -> str:
    """Power by design, before any round, at the planned noise (the profile's launch_noise_cv on each
    side of a round, nothing cancelled), its confirming block included (gate_power). Only a
    plan: the first look measures the host's own spread and says what it can resolve (``calibration``)."""
    cv = case.profile.launch_noise_cv
    sd = math.sqrt(2) * math.log1p(cv)
    if not gated:  # rounds for the report's paired ratios only
        return f"{points[-1]} round(s), no gate (--llmbench-fail-below not set)"
    return (f"looks at {', '.join(map(str, points))} rounds and a confirming block of {points[0]}, each gate "
            f"at false-alarm budget {gate_rules.share(alpha)} ({budget.SPENDING}); planned from "
            f"launch_noise_cv {cv:.0%} (paired sd {sd:.3f}): " + "; ".join(
                _resolves(metric, sd, worse_allowed(metric, pct), points, alpha) for metric, pct in gated))


def _resolves(metric: str, sd: float, allowed: float, points: list[int], alpha: float) -> str:
    """What one gate catches at spread ``sd``: a drop of twice the allowed one, how often, by the cap,
    confirming block included; and the drop it catches with POWER."""
    block = points[0]
    twice = gate_power(sd, 2 * allowed, allowed, points, alpha, block)
    caught = drop_caught(sd, allowed, points, alpha, block)
    said = f"{caught:.1%} with {gate_rules.POWER:.0%} power" if caught else "no drop with 80% power"
    return (f"{metric} catches a {2 * allowed:.1%} drop {twice:.0%} of the time by round {points[-1]} "
            f"(confirming block included), {said}")


def calibration(metric: str, log_ratios: list[float], allowed: float, points: list[int], alpha: float) -> str:
    """The host's noise as the first look measured it (paired sd of the log ratios, relative IQR of the
    ratios, as nvbench reports it) and what the gate can resolve at it; where it cannot resolve twice
    the allowed drop by its cap, say so, with the rounds that would take (budget.rounds_needed)."""
    sd = statistics.stdev(log_ratios)
    q = statistics.quantiles([math.exp(x) for x in log_ratios], n=4)
    median = statistics.median(math.exp(x) for x in log_ratios)
    head = (f"{metric}: this host's noise at the first look: paired sd {sd:.3f}, relative IQR "
            f"{(q[2] - q[0]) / median:.1%}; " + _resolves(metric, sd, allowed, points, alpha))
    if gate_power(sd, 2 * allowed, allowed, points, alpha, points[0]) >= gate_rules.POWER:
        return head
    needed = budget.rounds_needed(sd, allowed, alpha=budget.spend(alpha, points)[-1])
    return (f"{head}: at this noise it cannot resolve a {2 * allowed:.1%} drop within {points[-1]} rounds "
            f"({f'about {needed} would' if needed else 'no number of rounds here would'}; quieten the host, "
            f"or raise --llmbench-trials-max)")


POWERED = re.compile(r"it catches a [\d.]+% drop (\d+)% of the time")


def with_block(verdict: gate_rules.GateVerdict, log_ratios: list[float], allowed: float, points: list[int],
               alpha: float, block: int) -> gate_rules.GateVerdict:
    """``verdict`` with the drop it says it catches recomputed with its confirming block counted
    (gate_rules.paired_gate states the last look's alone), at the spread its rounds measured."""
    if len(log_ratios) < 2 or not POWERED.search(verdict.text):
        return verdict
    caught = drop_caught(statistics.stdev(log_ratios), allowed, points, alpha, block)
    power = gate_rules.POWER
    block_said = f"its {block}-round confirming block included"
    said = (f"it catches a {caught:.1%} drop {power:.0%} of the time, {block_said}" if caught
            else f"no drop is caught {power:.0%} of the time, {block_said}")
    return dataclasses.replace(verdict, text=POWERED.sub(said, verdict.text, count=1))
