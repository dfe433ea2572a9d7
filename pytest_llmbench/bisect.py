"""``--llmbench-bisect GOOD..BAD``: the first commit of a range that made a gated metric worse, found by
A/B at each step, as Chromium's Pinpoint bisects a performance regression.

Each step is one pytest session of the selected cases, started in a git worktree of the commit tried
with the same arguments plus ``--llmbench-ab ref=GOOD`` (the commit against the range's good end, in
one session, in balanced rounds: gates.py) and the same ``--llmbench-fail-below`` gates.

BAD is tried first: if no gate fails, the range holds no regression the gates can see, and the bisect
says so. Its failed gates measure the range's effect (BAD/GOOD per case and metric, e.g. 0.72). Every
later step is classified by which end its commit resembles (``resembles``), not by the gate's allowed
drop: a commit whose interval against GOOD lies wholly on GOOD's side of the geometric midpoint
between 1 and BAD's ratio (0.85 for 0.72) is like GOOD, wholly on BAD's side like BAD. A commit at
0.981 (0.938 to 1.046) is "inconclusive" against a 5% allowed drop, yet plainly not 0.72: Pinpoint
compares each commit with both sides for this reason. A step that is still undecided is run again with
twice the rounds; then it is passed over, as ``git bisect skip`` does, and the nearest untried commit
is tried instead. A commit that cannot be run (no harness/, a session that stores no verdict) is
skipped at once, by name.

The range is halved (git rev-list --ancestry-path GOOD..BAD, oldest first) until one commit is left;
that commit is tried last against its parent. If that step resembles BAD, the commit is named; if it
resembles GOOD, no one commit made the change: it is spread over several (three 4% commits), and the
bisect names the range it lies in, from the last commit whose interval held 1 to the first whose
interval held BAD's ratio. When commits were passed over, the smallest range left is named. Every
step, with its verdicts, what it resembled and its minutes, goes to OUTPUT/bisect/<time>.json and the
terminal.

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
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.transport import write_atomic
from pytest_llmbench import bisect_search
from pytest_llmbench.bisect_search import Step, judged, lines, search

STEP_ENV = "LLMBENCH_BISECT_STEP"  # set in a step's session: it runs the step, never bisects again
OWN = ("--llmbench-bisect", "--llmbench-ab", "--llmbench-output")  # the driver sets these per step
OWN_FLAGS = ("--llmbench-history-bisect",)  # and never passes these on


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


def run(config: pytest.Config, raw: str, where: str, output: str, cap: int) -> int:
    """The driver: every step a pytest session in a worktree; the summary printed and stored. ``cap``:
    the A/B gate's round cap a step runs to (doubled, at most MAX_TRIALS, for an undecided step's
    second try)."""
    from pytest_llmbench.profiles import MAX_TRIALS

    root = Path(str(config.rootpath))
    good, bad = parse_range(raw, where, root)
    commits = commits_between(root, good, bad)
    output = Path(output).resolve()  # --llmbench-output from its flag, env or ini
    args = strip_own(list(config.invocation_params.args))
    started = time.monotonic()

    more = min(2 * cap, MAX_TRIALS)

    def judge(commit: str, against: str, more_rounds: bool) -> Step:
        again = f", again with up to {more} rounds" if more_rounds else ""
        print(f"[llmbench] bisect: A/B of {commit[:12]} against {against[:12]}{again} ...", flush=True)
        extra = [f"--llmbench-trials-max={more}"] if more_rounds else []
        step = ab_step(root, commit, against, args + extra, output)
        print(f"[llmbench] bisect: {commit[:12]}: gates {step.outcome} ({step.why}; {step.minutes:.1f} min)",
              flush=True)
        return step

    def stop(signum, frame):  # SIGTERM (CI cancellation): unwind as Ctrl-C does, worktrees removed
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    steps: list[Step] = []
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        first_bad, _, spread_over = search(commits, good, judge, steps)
        stopped = None
    except KeyboardInterrupt as exc:
        first_bad, spread_over, stopped = None, None, str(exc) or "interrupted by Ctrl-C"
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = {"range": f"{good}..{bad}", "commits": commits, "first_bad": first_bad, "spread": spread_over,
               "stopped": stopped,
               "minutes": round((time.monotonic() - started) / 60, 2), "steps": [asdict(s) for s in steps]}
    path = output / "bisect" / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    write_atomic(path, json.dumps(summary, indent=1))
    for line in lines(summary):
        print(line)
    print(f"bisect stored in {path}")
    if stopped:
        return 2
    no_regression = bool(steps) and bisect_search.bad_end(summary)["outcome"] == "good"
    return 0 if first_bad or spread_over or no_regression else 1


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


def _sessions(output: Path) -> set[str]:
    results = output / "results"
    return {p.name for p in results.iterdir() if p.is_dir()} if results.is_dir() else set()


def _read_gates(folder: Path) -> dict | None:
    from pytest_llmbench.store import ResultStore

    return ResultStore(folder.parent.parent).gates(folder.name)


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None
