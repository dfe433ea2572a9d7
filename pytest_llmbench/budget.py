"""One error budget for every gate of a session: how the session's 2% is shared, how a sequential
gate spends its share over its looks, what ``METRIC:PCT`` allows (lower-is-better metrics gated as
their inverse), the confirming block a failure needs, the suite test, and the session effect the
stored-session gate widens its bounds by.

**Which gates.** Every pass/fail of a session on a measured number counts:

    case gates   selected cases x --llmbench-fail-below metrics: the A/B gate (gates.sequential) or
                 the stored-session gate (compare_gate.stored)
    memory       cases whose profile sets max_peak_memory_gib (verdicts.peak_memory)
    floors       cases whose profile sets min_scaling_efficiency at their world size
    suites       one per gated metric of an A/B session of two cases or more ("the suite got slower")

**How it is shared: weighted Bonferroni.** The suite tests take SUITE_SHARE of SESSION_ALPHA, every
other gate an equal share of the rest. A union bound: a session of clean cases fails anywhere at most
SESSION_ALPHA of the time, whatever the dependence between its gates, and each gate decides alone, as
pytest decides each case when it finishes (Holm's or Benjamini-Hochberg's steps order every p-value
first). A 51-case session with two gated metrics, a memory budget and a floor has 204 case gates:
each at 0.015 / 204 = 7.4e-5.

**How a gate spends its share over looks: Lan-DeMets, O'Brien-Fleming type** (Lan & DeMets 1983,
Biometrika 70:659; Jennison & Turnbull 2000, ch. 7): alpha(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t)) is
spent by the fraction t = n / cap of the cap's rounds; each look tests at its increment (a union bound
again, valid however the gate stops). It leaves nearly all of the share to the last look, where a
gate of a small share decides anything but a gross drop; Bonferroni's equal split left each of three
looks a third. Misses (a drop passed) are split evenly over the looks: the pass side only stops a
clean case early.

**What it costs in rounds.** A small share needs rounds to see a small drop: at the paired spread
0.05 a round, one case 10% slower (5% allowed) in a 51-case session is caught 15% of the time by 16
rounds and 71% by 32 and its confirming block (tests/unit/test_budget.py), so AB_CAP is 32. A clean
case still passes at its second look (8 rounds; 8.7 on average there): only a case near or past its
allowed drop runs on.

**The suite test** catches what no single small share can: many cases a little slower. For each
gated metric it pools every case's first-look rounds (always run, so no early stop biases it): a
one-sample t-test over the cases' mean log ratios, failing the session when the one-sided upper
bound of their mean is below log(1 - allowed). Every case 7% slower (5% allowed) fails it by the first
look; a single slower case barely moves it (the case gates catch that).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from harness import metrics
from pytest_llmbench import gate_rules, stats

SESSION_ALPHA = 0.02  # a session of clean cases fails anywhere at most this often
SUITE_SHARE = 0.25  # of SESSION_ALPHA, for the suite tests when the session has any
AB_FIRST = 4  # rounds at the A/B gate's first look (3 degrees of freedom)
AB_CAP = 32  # rounds at its last look: looks at 4, 8, 16 and 32
SPENDING = "Lan-DeMets O'Brien-Fleming-type spending over the looks"


def spend(alpha: float, points: list[int]) -> list[float]:
    """Each look's share of ``alpha`` at the rounds ``points`` (the last is the cap): the increments of
    alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), t = n / cap (O'Brien-Fleming type). They sum to
    ``alpha``; a single look gets all of it."""
    return list(_spend(alpha, tuple(points)))


@functools.lru_cache(maxsize=1024)
def _spend(alpha: float, points: tuple[int, ...]) -> tuple[float, ...]:
    cap, z = points[-1], stats.z_quantile(1 - alpha / 2)
    spent, out = 0.0, []
    for n in points:
        total = alpha if n >= cap else 2 - 2 * stats._phi(z / math.sqrt(n / cap))
        out.append(max(total - spent, 0.0))
        spent = max(spent, total)
    return tuple(out)


def misses(points: list[int], power: float = gate_rules.POWER) -> list[float]:
    """Each look's share of the miss budget 1 - power: an equal split."""
    return [(1 - power) / len(points)] * len(points)


@dataclass(frozen=True)
class Budget:
    """The gates of a session (module docstring) and each one's share of SESSION_ALPHA."""

    case_gates: int = 0
    memory: int = 0
    floors: int = 0
    suites: int = 0
    alpha: float = SESSION_ALPHA

    @property
    def count(self) -> int:
        return self.case_gates + self.memory + self.floors

    def suite_alpha(self) -> float:
        return self.alpha * SUITE_SHARE / self.suites if self.suites else 0.0

    def gate_alpha(self) -> float:
        """Each case gate's, memory budget's and scaling floor's share."""
        rest = self.alpha * (1 - SUITE_SHARE) if self.suites else self.alpha
        return rest / max(1, self.count)

    def line(self) -> str:
        parts = [f"{self.case_gates} regression gate(s) (cases x metrics)", f"{self.memory} memory budget(s)",
                 f"{self.floors} scaling floor(s)"]
        suite = (f"; {self.suites} suite test(s) at {gate_rules.share(self.suite_alpha())} each "
                 f"({SUITE_SHARE:.0%} of the budget)" if self.suites else "")
        return (f"error budget: a session of clean cases fails anywhere at most {self.alpha:.0%} of the "
                f"time; {', '.join(parts)}, each at {gate_rules.share(self.gate_alpha())}{suite} (weighted "
                f"Bonferroni; {SPENDING}: pytest_llmbench/budget.py)")


def for_session(settings, selected: list) -> Budget:
    """The gates of a session of the ``selected`` cases (pytest_llmbench/cases.py's Case)."""
    cases = {(c.profile.name, c.spec.case_id): c for c in selected if c.spec.benchmark != "collectives"}
    gated = len(settings.fail_below or [])
    memory = sum(c.profile.max_peak_memory_gib is not None for c in cases.values())
    floors = sum(c.profile.min_scaling_efficiency.get(c.spec.world_size) is not None for c in cases.values())
    suites = gated if settings.ab and len(cases) >= 2 else 0
    return Budget(case_gates=len(cases) * gated, memory=memory, floors=floors, suites=suites)


@dataclass(frozen=True)
class SuiteVerdict:
    failed: bool
    ratio: float  # exp(mean over cases of their mean log ratio)
    upper: float | None  # its one-sided upper bound
    text: str


def suite_test(case_means: list[float], allowed_drop: float, alpha: float) -> SuiteVerdict:
    """Did the suite as a whole get slower than allowed? ``case_means``: each case's mean log ratio
    (candidate over baseline, higher is better) over its first look's rounds. Fails when the
    one-sided (1 - alpha) t upper bound of their mean (cases - 1 degrees of freedom) is below
    log(1 - allowed); fewer than two cases decide nothing."""
    k = len(case_means)
    if k < 2:
        mean = case_means[0] if case_means else math.nan
        return SuiteVerdict(False, math.exp(mean), None, "fewer than two cases: no suite test")
    mean, sd = statistics.fmean(case_means), statistics.stdev(case_means)
    upper = mean + stats.t_quantile(1 - alpha, k - 1) * sd / math.sqrt(k)
    failed = upper < math.log1p(-allowed_drop)
    text = (f"the suite's {k} cases: mean new/old {math.exp(mean):.3f} over their first looks, upper bound "
            f"{math.exp(upper):.3f} against the floor {1 - allowed_drop:.3f} (one-sided t over the cases, "
            f"false-alarm budget {gate_rules.share(alpha)})")
    return SuiteVerdict(failed, math.exp(mean), math.exp(upper), text)


@dataclass(frozen=True)
class SessionEffect:
    variance: float  # between-session variance of a session's mean log value (0 when none is seen)
    sessions: int  # stored sessions with two or more trials of the case
    within_sd: float | None  # the pooled within-session sd of the log trial values
    text: str
    # single-trial stores (nightly): the variance of one session's first trial across the store's
    # sessions (session effect and trial noise together) and its degrees of freedom; None when unused
    total_var: float | None = None
    total_df: int = 0


HISTORY_SESSIONS = 3  # earlier sessions of one trial each that measure the noise (2 degrees of freedom)


def session_effect(sessions: list[list[float]]) -> SessionEffect:
    """The case's session effect from the store's sessions (each a list of log trial values):
    random effects by the method of moments over the sessions with at least two trials, tau^2 =
    var(session means) - mean(within variance / n), floored at 0 (DerSimonian & Laird 1986). Fewer
    than two such sessions (a store of nightly single-trial sessions): the variance of each session's
    first trial across HISTORY_SESSIONS or more sessions, which holds the session effect and the trial
    noise together (``total_var``: the gate's spread in place of a declared one). Fewer: no estimate,
    said."""
    usable = [s for s in sessions if len(s) >= 2]
    if len(usable) < 2 and len(firsts := [s[0] for s in sessions if s]) >= HISTORY_SESSIONS:
        total = statistics.variance(firsts)
        return SessionEffect(0.0, len(firsts), None, (
            f"noise measured between the store's {len(firsts)} earlier sessions of this case (one trial "
            f"each: session effect and launch noise together, sd {math.sqrt(total):.1%}, "
            f"{len(firsts) - 1} degrees of freedom)"), total, len(firsts) - 1)
    if len(usable) < 2:
        return SessionEffect(0.0, len(usable), None, (
            f"the store holds {len(usable)} earlier session(s) of this case with two or more trials and "
            f"{len(sessions)} in all: no session effect can be estimated, so none is allowed for and the "
            f"false-alarm budget holds only if sessions do not differ (store {HISTORY_SESSIONS} or more "
            f"sessions of it, run --llmbench-trials 2 or more, or gate with --llmbench-ab: it cancels it)"))
    means = [statistics.fmean(s) for s in usable]
    within = statistics.fmean(statistics.variance(s) / len(s) for s in usable)
    df = sum(len(s) - 1 for s in usable)
    pooled = math.sqrt(sum((len(s) - 1) * statistics.variance(s) for s in usable) / df)
    tau2 = max(statistics.variance(means) - within, 0.0)
    return SessionEffect(tau2, len(usable), pooled, (
        f"session effect sd {math.sqrt(tau2):.1%} (random effects over the store's {len(usable)} earlier "
        f"sessions with two or more trials; the bounds are widened by it)"))


def rounds_for_paired_gate(sd: float, allowed_drop: float, *, looks_at: list[int], alpha: float,
                           power: float = gate_rules.POWER) -> int | None:
    """The first of ``looks_at`` by which ``gate_rules.paired_gate``, spending ``alpha`` over them, fails
    a drop of twice the allowed one ``power`` of the time at a paired log-ratio spread ``sd``."""
    gap = math.log1p(-allowed_drop) - math.log1p(-2 * allowed_drop)
    shares, beta = spend(alpha, looks_at), misses(looks_at, power)
    for n, a, b in zip(looks_at, shares, beta, strict=True):
        if n >= 2 and a > 0 and sd / math.sqrt(n) * (stats.t_quantile(1 - a, n - 1)
                                                     + stats.t_quantile(1 - b, n - 1)) <= gap:
            return n
    return None


def rounds_needed(sd: float, allowed_drop: float, *, alpha: float, power: float = gate_rules.POWER,
                  limit: int = 10_000) -> int | None:
    """Rounds at which one final look at ``paired_gate``'s rule fails a drop of twice the allowed one
    ``power`` of the time with spread ``sd`` (what an undecided gate would have needed)."""
    gap = math.log1p(-allowed_drop) - math.log1p(-2 * allowed_drop)
    for n in range(2, limit + 1):
        if sd / math.sqrt(n) * (stats.t_quantile(1 - alpha, n - 1) + stats.t_quantile(power, n - 1)) <= gap:
            return n
    return None


def trials_for_gate(cv: float, allowed_drop: float, *, first: int = 1, alpha: float = gate_rules.ALPHA,
                    power: float = gate_rules.POWER, limit: int = 10_000) -> int | None:
    """The trial cap (the same count on the compared side) at which ``gate_rules.gate``, looking at
    ``gate_rules.looks(first, cap)`` and spending ``alpha`` over them, always decides at its last look:
    a drop of twice the allowed one is then caught at least ``power`` of the time."""
    gap = math.log1p(-allowed_drop) - math.log1p(-2 * allowed_drop)
    sd = math.log1p(cv)
    for cap in range(max(2, first), limit + 1):
        points = gate_rules.looks(first, cap)
        a, b = spend(alpha, points)[-1], misses(points, power)[-1]
        quantiles = stats.t_quantile(1 - a, 2 * cap - 2) + stats.t_quantile(1 - b, 2 * cap - 2)
        if sd * math.sqrt(2 / cap) * quantiles <= gap:
            return cap
    return None


def worse_allowed(metric: str, pct: float) -> float:
    """The allowed drop of the gated ratio for ``METRIC:PCT``: the gates read every metric as
    "goodness", candidate / baseline where higher is better and baseline / candidate where lower is
    (step time, peak memory), so PCT worse is a drop of PCT% or of 1 - 1 / (1 + PCT%)."""
    return pct / 100 if higher(metric) else 1 - 1 / (1 + pct / 100)


def goodness(metric: str, candidate, baseline) -> tuple:
    """(candidate, baseline) of ``metric`` as a higher-is-better pair (``worse_allowed``)."""
    return (candidate, baseline) if higher(metric) else (baseline, candidate)


def higher(metric: str) -> bool:
    """Whether higher is better for ``metric`` (the metric table's direction; unknown: higher)."""
    return next((m.higher for m in metrics.table() if m.name == metric), True) is not False


def suite_failures(session) -> list[str]:
    """The suite tests of an A/B session (suite_test): for each gated metric, the cases' first
    looks pooled; a failure's words, or a note when it passes."""
    out = []
    for metric, pct in session.settings.fail_below or []:
        means = [statistics.fmean(r[metric]) for r in session.ab_first.values() if len(r.get(metric, [])) > 0]
        if len(means) < 2 or not session.budget.suites:
            continue
        verdict = suite_test(means, worse_allowed(metric, pct), session.budget.suite_alpha())
        said = f"suite test: {metric} (allowed {pct:g}% worse): {verdict.text}"
        (out if verdict.failed else session.notes).append(said)
    return out


CONFIRM_LEVEL = 0.90  # a confirming block's one-sided bound


def confirmed(verdict: gate_rules.GateVerdict, block: list[float]) -> gate_rules.GateVerdict:
    """A failed gate after its confirming block (``block``: the block's own log ratios): it stays
    failed when the block alone shows the candidate worse (its one-sided 90% t upper bound below 1),
    else it is inconclusive (a transient, such as a burner that started between a round's launches).
    Both must hold to fail, so the false-alarm rate can only fall."""
    n = len(block)
    if n < 2:
        return gate_rules.GateVerdict("inconclusive", verdict.ratio,
                                      f"{verdict.text}; its confirming block did not run", verdict.detection,
                                      verdict.noise)
    mean = math.fsum(block) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in block) / (n - 1))
    upper = math.exp(mean + stats.t_quantile(CONFIRM_LEVEL, n - 1) * sd / math.sqrt(n))
    said = f"a confirming block of {n} more rounds: new/old {math.exp(mean):.3f}, upper bound {upper:.3f}"
    if upper < 1:
        return gate_rules.GateVerdict("fail", verdict.ratio, f"{verdict.text}; confirmed by {said}",
                                      verdict.detection, verdict.noise)
    return gate_rules.GateVerdict("inconclusive", verdict.ratio,
                                  f"{verdict.text}; not confirmed by {said} (a transient?)",
                                  verdict.detection, verdict.noise)
