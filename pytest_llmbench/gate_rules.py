"""Pass/fail with an error budget: the rules the gates apply to trial values (stats.py's intervals).

- ``gate``: the regression gate's three outcomes for new / old against an allowed drop, one look of
  a sequential test at the look's share of the error budget (pytest_llmbench/budget.py shares the
  session's 2% over its gates and looks); ``paired_gate`` the A/B gate's; ``floor_check`` the same
  rule for a threshold (scaling efficiency, the memory budget); ``looks`` when a sequential gate
  decides; ``powered_drop`` the drop a look catches with POWER.

With one trial a side, the gate and the floor check take the spread of the store's sessions where
given, else the declared launch noise, never failing one run a side on a difference within it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from pytest_llmbench.stats import Ratio, _phi, t_quantile

ALPHA = 0.02  # a clean case (alone; in a session: budget.SESSION_ALPHA) fails at most this often
POWER = 0.80  # the power a gate states the drop it catches at (powered_drop)
LAUNCH_NOISE = 0.05  # trial-to-trial cv assumed where no side has two trials (a profile's launch_noise_cv)


def looks(first: int, cap: int) -> list[int]:
    """The trial counts at which a sequential gate decides: ``first``, doubling, and ``cap``
    (first, 2 first, 4 first, ... cap): few looks, each a test (budget.spend shares the budget)."""
    points, n = [], max(1, first)
    while n < cap:
        points.append(n)
        n *= 2
    return [*points, max(cap, first)]


@dataclass(frozen=True)
class GateVerdict:
    outcome: str  # "pass", "fail" or "inconclusive" (more trials could settle it)
    ratio: Ratio  # new / old (geometric means); low/high: the one-sided bounds the rule used
    text: str
    detection: float  # the chance this look's rule catches a drop of twice the allowed one
    noise: str  # where the trial-to-trial spread came from


def _log_spread(samples: list[list[float]], noise_cv: float, declared: str = "launch noise",
                ) -> tuple[float, float, str]:
    """(sd of log values, degrees of freedom, where from): pooled over the sides with two or more
    trials, else the ``declared`` noise (degrees of freedom infinite)."""
    df = sum(len(x) - 1 for x in samples)
    if df < 1:
        return math.log1p(noise_cv), math.inf, f"declared {declared} cv {noise_cv:.0%} (one trial a side)"
    ss = sum(sum((v - statistics.fmean(x)) ** 2 for v in x) for x in samples if len(x) > 1)
    return math.sqrt(ss / df), df, f"measured: pooled over the trials ({df} degrees of freedom)"


def share(alpha: float) -> str:
    """A false-alarm budget as a percentage to three figures: 2%, 0.00735%."""
    return f"{alpha * 100:.3g}%"


def gate(new: list[float], old: list[float], allowed_drop: float, *, noise_cv: float = LAUNCH_NOISE,
         alpha: float = ALPHA, beta: float = 1 - POWER, last_look: bool = True,
         session_var: float = 0.0, history: tuple[float, int] | None = None) -> GateVerdict:
    """Regression gate on new / old (higher is better), one look of a sequential test.

    On the log scale, L = mean log(new) - mean log(old), SE from the pooled spread of the log trial
    values (or the declared launch noise with one trial a side), plus ``session_var``: the variance
    of a session's effect on the case (budget.session_effect), once for each of the two sessions.
    ``alpha`` and ``beta``: this look's shares of the false-alarm and miss budgets
    (budget.spend); q_a, q_b their one-sided quantiles (t, or normal for declared noise):

        fail          L + q_a SE < log(1 - allowed)        at most ``alpha`` of clean cases
        pass          L - q_b SE > log(1 - 2 allowed)      a drop of 2 x allowed passes at most ``beta``
        inconclusive  neither: run more trials (the next look), or at the last look a warning

    A single run a side is never failed within the launch noise: the declared cv is the spread, or
    ``history`` (variance, df: budget.session_effect's ``total_var``), measured; with more trials, the
    session effect is what ``history`` holds beyond the measured trial spread."""
    x, y = [math.log(v) for v in new], [math.log(v) for v in old]
    sd, df, where = _log_spread([x, y], noise_cv)
    if history and math.isinf(df):
        sd, df, where = math.sqrt(history[0]), history[1], f"measured across stored sessions, {history[1]} df"
    elif history is not None:
        session_var = max(session_var, history[0] - sd * sd)
    diff = statistics.fmean(x) - statistics.fmean(y)
    se = math.sqrt(sd * sd * (1 / len(x) + 1 / len(y)) + 2 * session_var)
    return decide(diff, se, df, allowed_drop, where=where, alpha=alpha, beta=beta, last_look=last_look)


def _log_kept(drop: float) -> float:
    """log(1 - drop), the ratio left after a drop; -inf for a drop of all of it or more (a scaling
    floor of 0.4 is an allowed drop of 60%: twice that leaves nothing)."""
    return math.log1p(-drop) if drop < 1 else -math.inf


def powered_drop(se: float, df: float, allowed_drop: float, *, alpha: float, power: float = POWER) -> float:
    """The true drop that one look at this standard error fails ``power`` of the time (the rule
    fails when L + q_a SE < log(1 - allowed): a true log ratio (q_a + z_power) SE below that)."""
    return 1 - math.exp(math.log1p(-allowed_drop) - (t_quantile(1 - alpha, df) + t_quantile(power, df)) * se)


def decide(diff: float, se: float, df: float, allowed_drop: float, *, where: str = "",
           alpha: float = ALPHA, beta: float = 1 - POWER, last_look: bool = True,
           pass_drop: float | None = None, powered: float | None = None) -> GateVerdict:
    """The gate's rule on the mean log ratio ``diff`` and its standard error, at one look whose
    shares of the budgets are ``alpha`` (false alarms) and ``beta`` (misses). It passes once the
    lower bound clears ``1 - pass_drop`` (default: twice the allowed drop, ``gate``'s indifference
    zone; the A/B gate passes only below the allowed drop itself). ``powered``: the drop the gate
    catches with POWER by its last look at the spread measured so far (said in the text);
    default: this look's."""
    q_a, q_b = t_quantile(1 - alpha, df), t_quantile(1 - beta, df)
    floor, far = math.log1p(-allowed_drop), _log_kept(2 * allowed_drop)
    cleared = _log_kept(2 * allowed_drop if pass_drop is None else pass_drop)
    upper, lower = diff + q_a * se, diff - q_b * se
    detection = _phi((floor - far) / se - q_a) if se > 0 else 1.0
    if powered is None:
        powered = powered_drop(se, df, allowed_drop, alpha=alpha)
    # an early look's share can be ~0 (budget.spend): its bound is then out of reach, not an overflow
    ratio = Ratio(math.exp(diff), math.exp(max(lower, -700.0)), math.exp(min(upper, 700.0)),
                  f"one-sided bounds at {1 - beta:.2%} and {1 - alpha:.4%}")
    rates = (f"false-alarm budget {share(alpha)} at this look; at this spread it catches a {powered:.1%} "
             f"drop {POWER:.0%} of the time; spread: {where}")
    text = (f"new/old = {ratio.value:.3f}, upper bound {ratio.high:.3f} against the floor "
            f"{1 - allowed_drop:.3f}, lower bound {ratio.low:.3f} against {math.exp(cleared):.3f}; "
            f"{rates}")
    if upper < floor:
        return GateVerdict("fail", ratio, text, detection, where)
    if lower > cleared:
        return GateVerdict("pass", ratio, text, detection, where)
    said = "undecided" if not last_look else "inconclusive at the last look (a warning, not a failure)"
    return GateVerdict("inconclusive", ratio, f"{text}: {said}", detection, where)


PAIRED_GATE = ("paired one-sample t-test of the rounds' log ratios (candidate / baseline, each round's own "
               "pair: drift between rounds cancels), group-sequential over planned looks, the gate's share "
               "of the session's budget spent over them by the Lan-DeMets O'Brien-Fleming-type function "
               "(pytest_llmbench/budget.py)")


def paired_gate(log_ratios: list[float], allowed_drop: float, *, alpha: float = ALPHA,
                beta: float = 1 - POWER, last_look: bool = True, cap: int | None = None,
                alpha_last: float | None = None) -> GateVerdict:
    """The A/B gate on candidate / baseline from each round's paired log ratio: the spread is the
    rounds' own (n - 1 degrees of freedom), never a declared one; fewer than two rounds decide
    nothing. The rule is ``decide``'s, with no indifference zone: it fails when the drop is
    confidently beyond the allowed one, passes when confidently within it, and otherwise runs more
    rounds (a candidate truly at the allowed drop ends undecided at the cap: a warning). ``cap`` and
    ``alpha_last``: the last look's rounds and share, for the drop it would catch with POWER there."""
    if len(log_ratios) < 2:
        ratio = Ratio(math.exp(log_ratios[0]) if log_ratios else math.nan, None, None, "one round")
        return GateVerdict("inconclusive", ratio, "one round measures no spread: no verdict", 0.0, "none")
    n = len(log_ratios)
    mean = math.fsum(log_ratios) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in log_ratios) / (n - 1))  # statistics.stdev, faster
    last = max(cap or n, n)
    powered = powered_drop(sd / math.sqrt(last), last - 1, allowed_drop,
                           alpha=alpha if alpha_last is None else alpha_last)
    return decide(mean, sd / math.sqrt(n), n - 1, allowed_drop,
                  where=f"measured: {n} paired rounds (sd of the log ratio {sd:.3f})", alpha=alpha,
                  beta=beta, last_look=last_look, pass_drop=allowed_drop, powered=powered)


def floor_check(logs: list[float], floor: float, *, noise_cv: float = LAUNCH_NOISE, launches: int = 2,
                alpha: float = ALPHA, declared: str = "launch noise", session_var: float = 0.0,
                history: tuple[float, int] | None = None) -> GateVerdict:
    """A threshold on a ratio (scaling efficiency: tokens/s at N over N/N0 x its baseline's) with the
    gate's false-alarm budget. ``logs``: the log of each trial's ratio (paired: each against its own
    round's baseline). Fails only when the one-sided (1 - alpha) upper bound of the mean log ratio is
    below log(floor): a case truly at the floor fails at most ``alpha`` of the time. With one trial the
    spread is the declared launch noise of the ``launches`` runs behind the ratio. ``detection``: the
    chance of failing a case whose true ratio is 10% below the floor. ``session_var`` and ``history``:
    the store's session effect and one session's spread across it, as ``gate`` takes them."""
    sd, df, where = _log_spread([logs], noise_cv, declared)
    if history and math.isinf(df):
        sd, df, where = math.sqrt(history[0]), history[1], f"measured across stored sessions, {history[1]} df"
    elif math.isinf(df):
        sd *= math.sqrt(launches)
    elif history:
        session_var = max(session_var, history[0] - sd * sd)
    mean, se = statistics.fmean(logs), math.sqrt(sd * sd / len(logs) + session_var)
    q = t_quantile(1 - alpha, df)
    upper = mean + q * se
    detection = _phi(-math.log(0.9) / se - q) if se > 0 else 1.0
    ratio = Ratio(math.exp(mean), None, math.exp(upper), f"one-sided {1 - alpha:.0%} upper bound")
    text = (f"{ratio.value:.3f} (upper bound {ratio.high:.3f}, {len(logs)} trial(s); false-alarm "
            f"budget {share(alpha)}; one 10% below the floor is caught {detection:.0%} of the time; "
            f"spread: {where})")
    return GateVerdict("fail" if upper < math.log(floor) else "pass", ratio, text, detection, where)


