"""``--llmbench-bisect GOOD..BAD``: the first commit of a range that made a gated metric worse, found by
A/B at each step, as Chromium's Pinpoint bisects a performance regression.

Each step is one pytest session of the selected cases, started in a git worktree of the commit tried
with the same arguments plus ``--llmbench-ab ref=GOOD`` (the commit against the range's good end, in
one session, in balanced rounds: gates.py) and the same ``--llmbench-fail-below`` gates. A step is

    bad        a gate failed (a case's, or the suite test)
    good       every gate of every case passed
    undecided  anything else (a gate undecided at its cap, a side that failed to run)

First BAD itself is tried: if it is not bad, the range holds no regression the gates can see, and the
bisect says so. Then the range is halved (git rev-list --ancestry-path GOOD..BAD, oldest first) until
one commit is left: the first bad one, tried last against its parent for its paired ratio and
interval. An undecided step stops the search and names the range still left. Every step, with its
verdicts and minutes, goes to OUTPUT/bisect/<time>.json and the terminal.

``--llmbench-history-bisect`` takes the range from the stored history instead (``from_history``): the
latest change point that made a gated metric worse, from its last good commit to its first bad one.

A step's session reads the worktree's own tests, conftest and profiles: paths given on the command
line resolve there, so a file outside the repository must be given as an absolute path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.transport import write_atomic

STEP_ENV = "LLMBENCH_BISECT_STEP"  # set in a step's session: it runs the step, never bisects again
OWN = ("--llmbench-bisect", "--llmbench-ab", "--llmbench-output")  # the driver sets these per step
OWN_FLAGS = ("--llmbench-history-bisect",)  # and never passes these on


@dataclass
class Step:
    commit: str
    against: str
    outcome: str  # "bad", "good" or "undecided"
    why: str
    minutes: float
    verdicts: dict = field(default_factory=dict)  # the step session's _gates.json


def parse_range(raw: str, where: str, root: Path) -> tuple[str, str]:
    """``GOOD..BAD`` as two full commit ids of the repository at ``root``; a usage error naming
    ``where`` otherwise (no '..', a ref git does not know, GOOD not an ancestor of BAD)."""
    good, sep, bad = raw.partition("..")
    if not sep or not good.strip() or not bad.strip():
        raise pytest.UsageError(f"{where}: {raw!r} is not GOOD..BAD (two git refs, e.g. v1.2..HEAD)")
    ids = []
    for ref in (good.strip(), bad.strip()):
        commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if not commit:
            raise pytest.UsageError(f"{where}: {ref!r} is not a commit of the repository at {root}")
        ids.append(commit)
    if subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", *ids]).returncode != 0:
        raise pytest.UsageError(f"{where}: {good.strip()} is not an ancestor of {bad.strip()}: no range")
    if not commits_between(root, *ids):
        raise pytest.UsageError(f"{where}: {raw!r} holds no commit after {good.strip()}: nothing to bisect")
    return ids[0], ids[1]


def from_history(output: str, gates: list[tuple[str, float]], echo: Callable[[str], None],
                 where: str = "--llmbench-history-bisect") -> str | None:
    """``LAST_GOOD..FIRST_BAD`` of the latest change point in OUTPUT's stored history (report/history.py)
    that made a gated metric worse by more than its allowed drop, or None, saying why (no such change;
    a change within one commit's sessions, which no bisect can split). A usage error naming ``where``
    when no stored session holds a gated metric the history keeps: nothing was compared."""
    from harness import metrics
    from pytest_llmbench.report import history

    allowed = {metric: pct / 100 for metric, pct in gates}
    higher = {m.name: m.higher for m in metrics.table()}
    series = history.collect(output, tuple(m for m in allowed if m in history.METRICS))
    if not series:
        raise pytest.UsageError(f"{where}: {output} holds no stored session with {', '.join(allowed)} "
                                f"(the history keeps {', '.join(history.METRICS)}): no history to bisect")
    worse = [(change.session, s, change) for s in series for change in s.changes
             if (-change.change if higher[s.metric] else change.change) > allowed[s.metric]]
    if not worse:
        echo(f"[llmbench] history bisect: no change point in {len(series)} stored series of {output} made "
             f"{', '.join(allowed)} worse by more than the allowed drop: nothing to bisect")
        return None
    _, found, change = max(worse, key=lambda w: w[0])
    echo(f"[llmbench] history bisect: {found.label} {found.metric} {change.change:+.1%} at session "
         f"{change.session} ({change.range})")
    if change.last_good == change.commit or "-" in (change.last_good, change.commit):
        echo(f"[llmbench] history bisect: the change lies between sessions of commit {change.commit}: "
             f"no commit range to bisect (the runner or the noise changed, not the code)")
        return None
    return change.range


def commits_between(root: Path, good: str, bad: str) -> list[str]:
    """The commits after GOOD up to BAD on the path between them, oldest first."""
    out = _git(root, "rev-list", "--ancestry-path", "--reverse", f"{good}..{bad}") or ""
    return out.split()


def search(commits: list[str], good: str, judge: Callable[[str, str], Step],
           steps: list[Step] | None = None) -> tuple[str | None, list[Step]]:
    """(the first bad commit or None, the steps): ``judge(commit, against)`` runs one A/B step. BAD
    (the last commit) first; then halving, every step against ``good``; the first bad one last
    against its parent. A commit that cannot be judged (``skipped``: no harness/ at it, or a session
    with no verdict) is passed over as ``git bisect skip`` does: the nearest untried commit of the
    range is judged instead. ``steps``: the list the steps are added to as they end (kept if stopped)."""
    steps = [] if steps is None else steps
    steps.append(judge(commits[-1], good))
    if steps[0].outcome != "bad":
        return None, steps
    low, high = -1, len(commits) - 1  # commits[low] is good (-1: GOOD itself), commits[high] bad
    passed: set[int] = set()
    while high - low > 1:
        untried = [i for i in range(low + 1, high) if i not in passed]
        if not untried:
            return None, steps  # every commit left was passed over: the range is the answer (lines())
        mid = min(untried, key=lambda i: (abs(i - (low + high) / 2), i))
        steps.append(judge(commits[mid], good))
        if steps[-1].outcome in ("undecided", "skipped"):
            passed.add(mid)
            continue
        low, high = (low, mid) if steps[-1].outcome == "bad" else (mid, high)
    parent = commits[high - 1] if high > 0 else good
    steps.append(judge(commits[high], parent))
    return commits[high], steps


def run(config: pytest.Config, raw: str, where: str, output: str) -> int:
    """The driver: every step a pytest session in a worktree; the summary printed and stored."""
    root = Path(str(config.rootpath))
    good, bad = parse_range(raw, where, root)
    commits = commits_between(root, good, bad)
    output = Path(output).resolve()  # --llmbench-output from its flag, env or ini
    args = strip_own(list(config.invocation_params.args))
    started = time.monotonic()

    def judge(commit: str, against: str) -> Step:
        print(f"[llmbench] bisect: A/B of {commit[:12]} against {against[:12]} ...", flush=True)
        step = ab_step(root, commit, against, args, output)
        print(f"[llmbench] bisect: {commit[:12]} is {step.outcome} ({step.why}; {step.minutes:.1f} min)",
              flush=True)
        return step

    def stop(signum, frame):  # SIGTERM (CI cancellation): unwind as Ctrl-C does, worktrees removed
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    steps: list[Step] = []
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        first_bad, _ = search(commits, good, judge, steps)
        stopped = None
    except KeyboardInterrupt as exc:
        first_bad, stopped = None, str(exc) or "interrupted by Ctrl-C"
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = {"range": f"{good}..{bad}", "commits": commits, "first_bad": first_bad, "stopped": stopped,
               "minutes": round((time.monotonic() - started) / 60, 2), "steps": [asdict(s) for s in steps]}
    path = output / "bisect" / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    write_atomic(path, json.dumps(summary, indent=1))
    for line in lines(summary):
        print(line)
    print(f"bisect stored in {path}")
    if stopped:
        return 2
    return 0 if first_bad or steps[0].outcome == "good" else 1


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
    elif steps[0]["outcome"] == "good":
        head = (f"no regression in {summary['range']}: its last commit passed every gate against its "
                f"first ({steps[0]['why']})")
    else:
        head = f"no single commit named: {range_left(summary)}"
    return [head, *(f"  {s['commit'][:12]} vs {s['against'][:12]}: {s['outcome']} ({s['why']}, "
                     f"{s['minutes']:.1f} min)" for s in steps)]


def range_left(summary: dict) -> str:
    """The smallest range the steps leave, for a search that could not name one commit."""
    commits, steps = summary["commits"], summary["steps"]
    order = {c: i for i, c in enumerate(commits)}
    good = max((order[s["commit"]] for s in steps if s["outcome"] == "good" and s["commit"] in order),
               default=-1)
    bad = min((order[s["commit"]] for s in steps if s["outcome"] == "bad" and s["commit"] in order),
              default=len(commits) - 1)
    left = commits[good + 1:bad + 1]
    passed = [s["commit"][:12] for s in steps if s["outcome"] in ("skipped", "undecided")]
    start = summary["range"].split("..")[0] if good < 0 else commits[good]
    return (f"the change lies in {start[:12]}..{commits[bad][:12]} ({len(left)} commit(s): "
            f"{', '.join(c[:12] for c in left)}); passed over: {', '.join(passed) or 'none'}")


def strip_own(args: list[str]) -> list[str]:
    """The command line without the options the driver sets per step (both ``--opt=v`` and ``--opt v``)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in OWN:
            skip = True
        elif arg in OWN_FLAGS:
            continue
        elif not arg.startswith(tuple(f"{opt}=" for opt in OWN)):
            out.append(arg)
    return out


def ab_step(root: Path, commit: str, against: str, args: list[str], output: Path) -> Step:
    """One A/B session of ``commit`` against ``against``, in a worktree of ``commit``; a commit without
    ``harness/`` is skipped (nothing of it could run). The session is a process group of its own: on
    Ctrl-C or SIGTERM it is sent SIGTERM (it stores its stopped case, as any session does), given
    STOP_GRACE_S, then killed; the worktree goes in every case."""
    if subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}:harness"],
                      capture_output=True).returncode != 0:
        return Step(commit, against, "skipped", "no harness/ at this commit: nothing of it can run", 0.0)
    tree = Path(tempfile.mkdtemp(prefix="llmbench-bisect-")) / commit[:12]
    started = time.monotonic()
    try:
        made = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--force", str(tree),
                               commit], capture_output=True, text=True)
        if made.returncode != 0:
            return Step(commit, against, "skipped", f"git worktree add failed: {made.stderr.strip()}", 0.0)
        before = _sessions(output)
        env = {k: v for k, v in os.environ.items() if k not in ("LLMBENCH_BISECT", "LLMBENCH_AB")}
        logs = tree.parent
        with open(logs / "stdout", "w+") as out, open(logs / "stderr", "w+") as err:
            session = subprocess.Popen([sys.executable, "-m", "pytest", *args, f"--llmbench-ab=ref={against}",
                                        f"--llmbench-output={output}"], cwd=tree,
                                       env={**env, STEP_ENV: commit}, stdout=out, stderr=err,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                returncode = session.wait()
            except BaseException:
                _end_group(session)
                raise
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        minutes = (time.monotonic() - started) / 60
        new = sorted(_sessions(output) - before)
        gates = _read_gates(output / "results" / new[-1]) if new else None
        outcome, why = judged(gates, returncode, stdout, stderr)
        return Step(commit, against, outcome, why, round(minutes, 2), gates or {})
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
        subprocess.run(["git", "-C", str(root), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


STOP_GRACE_S = 60.0  # a stopped step session's time to store its case and retire its ranks


def _end_group(session: subprocess.Popen) -> None:
    """SIGTERM to the step session's whole process group, then SIGKILL after STOP_GRACE_S."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session.pid, signal.SIGTERM)
    try:
        session.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session.pid, signal.SIGKILL)  # anything of the group still there (ranks)
    session.wait()


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
        return "undecided", f"the session stored no A/B verdict (exit {returncode}: {' | '.join(said)})"
    said = [f"{case} {metric} {v['outcome']} {v['ratio']:.3f} ({v['low']:.3f} to {bound(v['high'])}, "
            f"{v['rounds']} rounds)" for case, metrics in sorted(gates["cases"].items())
            for metric, v in sorted(metrics.items())]
    outcomes = {v["outcome"] for m in gates["cases"].values() for v in m.values()}
    if "fail" in outcomes or gates.get("suite_failures"):
        return "bad", "; ".join(said + list(gates.get("suite_failures") or []))
    if outcomes == {"pass"} and not any(gates.get("side_failures", {}).values()):
        return "good", "; ".join(said)
    return "undecided", "; ".join(said) or "a side failed"


def _sessions(output: Path) -> set[str]:
    results = output / "results"
    return {p.name for p in results.iterdir() if p.is_dir()} if results.is_dir() else set()


def _read_gates(folder: Path) -> dict | None:
    from pytest_llmbench.store import ResultStore

    return ResultStore(folder.parent.parent).gates(folder.name)


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None
