"""The search of ``--llmbench-bisect`` (bisect.py), apart from the sessions it runs: the steps' data,
how a step is judged from its session's stored verdicts, which end of the range a commit resembles, the
halving with skips and retries, and the words of the result. Pure: tests/unit/test_bisect.py drives it
with judges drawn there, and experiments/bisect-noise/ with A/B rounds drawn through gates.sequential.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Step:
    commit: str
    against: str
    outcome: str  # the gates': "bad", "good", "undecided", or "skipped" (nothing could be measured)
    why: str
    minutes: float
    verdicts: dict = field(default_factory=dict)  # the step session's _gates.json
    like: str = ""  # which end of the range it resembles: "bad", "good" or "undecided" (``resembles``)


Effect = dict[tuple[str, str], float]  # (case, metric) -> BAD/GOOD, as goodness


def effect_of(step: Step) -> Effect:
    """What the range did, measured by its BAD step: the ratio of every (case, metric) whose gate failed."""
    cases = step.verdicts.get("cases") or {}
    return {(case, metric): v["ratio"] for case, metrics in cases.items() for metric, v in metrics.items()
            if v.get("outcome") == "fail" and isinstance(v.get("ratio"), (int, float)) and v["ratio"] > 0}


def resembles(step: Step, effect: Effect) -> str:
    """Which end of the range ``step``'s commit is like, for each metric the range moved: like BAD when it
    is confidently worse than its other side (its gate failed, or its interval lies below 1) and not
    confidently better than BAD (its interval reaches BAD's ratio); like GOOD the other way round; when
    both or neither hold, by its interval against the geometric midpoint of 1 and BAD's ratio. Then
    "bad" when some metric is like BAD and none like GOOD, "good" when every one is like GOOD, else
    "undecided". Without a measured effect (BAD failed only the suite test), the gates' own outcome."""
    cases = step.verdicts.get("cases") or {}
    if not effect or step.outcome == "skipped" or not cases:
        return step.outcome
    votes = set()
    for (case, metric), bad in effect.items():
        v = cases.get(case, {}).get(metric) or {}
        low, high = v.get("low"), v.get("high")
        if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
            votes.add("undecided")
            continue
        from_good, from_bad = v.get("outcome") == "fail" or high < 1, low > bad  # goodness: BAD below 1
        if from_good != from_bad:
            votes.add("bad" if from_good else "good")
            continue
        mid = math.sqrt(bad)
        votes.add("bad" if high < mid else "good" if low > mid else "undecided")
    if votes == {"good"}:
        return "good"
    return "bad" if "bad" in votes and "good" not in votes else "undecided"


def _holds(step: Step, effect: Effect, value: float | None) -> bool:
    """Every metric's interval of ``step`` holds ``value`` (1: like GOOD; None: BAD's own ratio)."""
    cases = step.verdicts.get("cases") or {}
    for (case, metric), bad in effect.items():
        v = cases.get(case, {}).get(metric) or {}
        target = bad if value is None else value
        if not (isinstance(v.get("low"), (int, float)) and isinstance(v.get("high"), (int, float))
                and v["low"] <= target <= v["high"]):
            return False
    return bool(effect)


def search(commits: list[str], good: str, judge: Callable[..., Step],
           steps: list[Step] | None = None) -> tuple[str | None, list[Step], str | None]:
    """(the first bad commit or None, the steps, the range of a change spread over several commits or
    None): ``judge(commit, against, more_rounds)`` runs one A/B step. BAD (the last commit) first (again
    with ``more_rounds`` if its gates were undecided); then
    halving, every step against ``good`` and classified by ``resembles``; an undecided one judged again
    with ``more_rounds``, then passed over; the first bad one last against its parent. ``steps``: the
    list the steps are added to as they end (kept if stopped)."""
    steps = [] if steps is None else steps
    steps.append(judge(commits[-1], good, False))
    if steps[-1].outcome == "undecided":  # BAD itself, undecided: once more with more rounds
        steps.append(judge(commits[-1], good, True))
    if steps[-1].outcome != "bad":
        return None, steps, None
    effect = effect_of(steps[-1])
    steps[-1].like = "bad"

    def tried(commit: str, against: str) -> str:
        steps.append(judge(commit, against, False))
        steps[-1].like = resembles(steps[-1], effect)
        if steps[-1].like == "undecided":
            steps.append(judge(commit, against, True))
            steps[-1].like = resembles(steps[-1], effect)
        return steps[-1].like

    low, high = -1, len(commits) - 1  # commits[low] is like GOOD (-1: GOOD itself), commits[high] like BAD
    passed: set[int] = set()
    while high - low > 1:
        untried = [i for i in range(low + 1, high) if i not in passed]
        if not untried:
            return None, steps, None  # every commit left was passed over: the range is the answer (lines())
        mid = min(untried, key=lambda i: (abs(i - (low + high) / 2), i))
        like = tried(commits[mid], good)
        if like in ("undecided", "skipped"):
            passed.add(mid)
            continue
        low, high = (low, mid) if like == "bad" else (mid, high)
    parent = commits[high - 1] if high > 0 else good
    if tried(commits[high], parent) != "good":
        return commits[high], steps, None
    return None, steps, spread(commits, good, steps, effect, high)


def spread(commits: list[str], good: str, steps: list[Step], effect: Effect, at: int) -> str:
    """The range a change spread over several commits lies in: from the last commit before ``at`` whose
    interval against GOOD held 1 (else GOOD) to the first from ``at`` on whose interval held BAD's ratio
    (else BAD)."""
    order = {c: i for i, c in enumerate(commits)}
    against_good = [s for s in steps if s.against == good and s.commit in order]
    start = max((order[s.commit] for s in against_good if order[s.commit] < at and _holds(s, effect, 1.0)),
                default=-1)
    end = min((order[s.commit] for s in against_good if order[s.commit] >= at and _holds(s, effect, None)),
              default=len(commits) - 1)
    return f"{good if start < 0 else commits[start]}..{commits[end]}"


def lines(summary: dict) -> list[str]:
    """The bisect's words: what it found, then one line per step."""
    steps, first_bad = summary["steps"], summary["first_bad"]
    if summary.get("stopped") or not steps:
        head = (f"stopped after {len(steps)} step(s) ({summary.get('stopped') or 'no step ran'}); the steps "
                f"so far are kept")
    elif first_bad:
        last = steps[-1]
        head = (f"first bad commit: {first_bad} ({last['why']}), {len(steps)} A/B steps over "
                f"{len(summary['commits'])} commits in {summary['minutes']:.1f} min")
    elif summary.get("spread"):
        last = steps[-1]
        head = (f"no single commit made the change: it is spread over {_short(summary['spread'])} (the "
                f"first commit past half of it, {last['commit'][:12]}, against its parent: {last['why']})")
    elif (end := bad_end(summary))["outcome"] == "good":
        head = (f"no regression in {summary['range']}: its last commit passed every gate against its "
                f"first ({end['why']})")
    elif end["outcome"] != "bad":
        head = (f"no regression the gates can see in {summary['range']}: its last commit against its first "
                f"was {end['outcome']} ({end['why']})")
    else:
        head = f"no single commit named: {range_left(summary)}"
    return [head, *(f"  {s['commit'][:12]} vs {s['against'][:12]}: like {s.get('like') or s['outcome']} "
                     f"(gates {s['outcome']}: {s['why']}, {s['minutes']:.1f} min)" for s in steps)]


def bad_end(summary: dict) -> dict:
    """The step that judged BAD against GOOD: the last of the steps that open the search (a second try
    with more rounds follows an undecided first)."""
    bad, good = summary["commits"][-1], summary["range"].split("..")[0]
    opening = [s for s in summary["steps"][:2] if (s["commit"], s["against"]) == (bad, good)]
    return opening[-1] if opening else summary["steps"][0]


def _short(span: str) -> str:
    return "..".join(ref[:12] for ref in span.split(".."))


def range_left(summary: dict) -> str:
    """The smallest range the steps leave, for a search that could not name one commit."""
    commits, steps = summary["commits"], summary["steps"]
    order = {c: i for i, c in enumerate(commits)}
    start = summary["range"].split("..")[0]
    like = [(s.get("like") or s["outcome"], s) for s in steps if s["against"] == start]  # against GOOD
    good = max((order[s["commit"]] for v, s in like if v == "good" and s["commit"] in order), default=-1)
    bad = min((order[s["commit"]] for v, s in like if v == "bad" and s["commit"] in order),
              default=len(commits) - 1)
    left = commits[good + 1:bad + 1]
    passed = list(dict.fromkeys(s["commit"][:12] for v, s in like if v in ("skipped", "undecided")))
    start = start if good < 0 else commits[good]
    return (f"the change lies in {start[:12]}..{commits[bad][:12]} ({len(left)} commit(s): "
            f"{', '.join(c[:12] for c in left)}); passed over: {', '.join(passed) or 'none'}")


def bound(high: float) -> str:
    """An interval's upper end as said: at an early look the gate's t quantile is huge (its alpha is
    spent over the looks) and the end can pass 1e300, which ``:.3f`` spells in 300 digits."""
    return f"{high:.3f}" if high < 1000 else "above 1000"


def judged(gates: dict | None, returncode: int, stdout: str, stderr: str = "") -> tuple[str, str]:
    """(outcome, why) of a step from its session's verdicts; without one, the session's own last words
    (its stderr's tail, where a usage error or a traceback goes, else its stdout's)."""
    if not gates or not gates.get("cases"):
        said = [line for line in stderr.strip().splitlines() if line.strip()][-3:] or \
            (stdout.strip().splitlines() or ["no output"])[-1:]
        return "skipped", f"the session stored no A/B verdict (exit {returncode}: {' | '.join(said)})"
    said = [f"{case} {metric} {v['outcome']} {v['ratio']:.3f} ({v['low']:.3f} to {bound(v['high'])}, "
            f"{v['rounds']} rounds)" for case, metrics in sorted(gates["cases"].items())
            for metric, v in sorted(metrics.items())]
    outcomes = {v["outcome"] for m in gates["cases"].values() for v in m.values()}
    if "fail" in outcomes or gates.get("suite_failures"):
        return "bad", "; ".join(said + list(gates.get("suite_failures") or []))
    if outcomes == {"pass"} and not any(gates.get("side_failures", {}).values()):
        return "good", "; ".join(said)
    return "undecided", "; ".join(said) or "a side failed"
