"""``--llmbench-bisect`` apart from its A/B sessions (pytest_llmbench/bisect.py): the search over a
range with a judge drawn here, the range's usage errors on a real git repository, the command line a
step gets, and how a step's stored verdicts are read. The A/B session a step runs is the one
tests/plugin/test_ab.py runs."""

from __future__ import annotations

import json
import subprocess

import pytest

from pytest_llmbench import bisect, bisect_search
from pytest_llmbench.bisect_search import Step, lines, search


def judge_with(first_bad: int | None, commits: list[str], undecided: set[str] = frozenset()):
    tried = []

    def judge(commit: str, against: str, more_rounds: bool = False) -> Step:
        tried.append((commit, against))
        bad = first_bad is not None and commits.index(commit) >= first_bad
        outcome = "undecided" if commit in undecided else "bad" if bad else "good"
        return Step(commit, against, outcome, "drawn", 1.0)

    return judge, tried


@pytest.mark.parametrize("first_bad", range(12))
def test_the_search_names_the_first_bad_commit_in_a_logarithmic_number_of_steps(first_bad):
    commits = [f"c{i:02d}" for i in range(12)]
    judge, tried = judge_with(first_bad, commits)
    found, steps, spread = search(commits, "good", judge)
    assert found == commits[first_bad] and spread is None
    assert len(steps) <= 2 + 4  # BAD, at most ceil(log2 12) halvings, the first bad against its parent
    assert tried[0] == ("c11", "good") and all(against == "good" for _, against in tried[:-1])
    assert tried[-1] == (commits[first_bad], commits[first_bad - 1] if first_bad else "good")


def test_a_range_without_a_regression_says_so_and_an_undecided_step_is_passed_over():
    commits = [f"c{i}" for i in range(5)]
    found, steps, _ = search(commits, "good", judge_with(None, commits)[0])
    assert found is None and [s.outcome for s in steps] == ["good"]
    summary = {"range": "good..c4", "commits": commits, "first_bad": None, "minutes": 1.0,
               "steps": [vars(s) for s in steps]}
    assert lines(summary)[0].startswith("no regression in good..c4")
    # c1 cannot be judged, twice (the second time with more rounds): the search judges its neighbours
    # instead and names the range left
    found, steps, _ = search(commits, "good", judge_with(1, commits, undecided={"c1"})[0])
    assert found is None and [s.commit for s in steps] == ["c4", "c1", "c1", "c2", "c0"]
    assert lines({**summary, "steps": [vars(s) for s in steps]})[0] == (
        "no single commit named: the change lies in c0..c2 (2 commit(s): c1, c2); passed over: c1")
    # a skipped commit whose neighbour decides: the first bad one is still named
    found, steps, _ = search(commits, "good", judge_with(3, commits, undecided={"c3"})[0])
    assert found is None and lines({**summary, "steps": [vars(s) for s in steps]})[0].startswith(
        "no single commit named: the change lies in c2..c4")
    found, steps, _ = search(commits, "good", judge_with(4, commits, undecided={"c2"})[0])
    assert found == "c4" and "c2" in [s.commit for s in steps]


def measured(truth: dict[str, float], first_look: dict[str, tuple[float, float, float]] | None = None,
             width: float = 0.03):
    """A judge whose steps carry verdicts as a session stores them: each commit's true ratio against GOOD
    (``truth``; against a parent, the ratio of the two), the gate failing below 0.95, passing above it
    with the interval clear of 0.95, otherwise inconclusive; ``width``: the interval's half-width, relative;
    ``first_look``: a commit's (ratio, low, high) at its first try instead (a noisy step)."""
    calls = []

    def judge(commit: str, against: str, more_rounds: bool = False) -> Step:
        calls.append((commit, against, more_rounds))
        ratio = truth[commit] / truth.get(against, 1.0)
        low, high = ratio * (1 - width), ratio * (1 + width)
        if first_look and commit in first_look and not more_rounds:
            ratio, low, high = first_look[commit]
        outcome = "fail" if high < 0.95 else "pass" if low > 0.95 else "inconclusive"
        verdicts = {"cases": {"cpu-ddp-ws2": {"tokens_per_s": {"outcome": outcome, "ratio": ratio, "low": low,
                                                               "high": high, "rounds": 32}}},
                    "side_failures": {}, "suite_failures": []}
        return Step(commit, against, *bisect.judged(verdicts, 0, ""), 1.0, verdicts)

    return judge, calls


def test_a_step_is_classified_by_the_end_it_resembles_not_by_the_allowed_drop():
    """The issue's run: BAD 0.722 against GOOD; a docs-only commit with GOOD's code read 0.981 (0.938 to
    1.046): inconclusive against the 5% allowed drop, so the old search stopped and named nothing. It is
    like GOOD (its interval lies above 0.85, the midpoint of 1 and 0.722), and the search goes on."""
    commits = ["c0", "c1", "c2", "c3"]
    truth = {"c0": 1.0, "c1": 1.0, "c2": 0.722, "c3": 0.722}
    judge, calls = measured(truth, first_look={"c1": (0.981, 0.938, 1.046)})
    found, steps, spread = search(commits, "good", judge)
    assert found == "c2" and spread is None
    step_c1 = next(s for s in steps if s.commit == "c1")
    assert step_c1.outcome == "undecided" and step_c1.like == "good"
    assert not any(more for _, _, more in calls)  # decided at its first try: no second one
    said = lines({"range": "good..c3", "commits": commits, "first_bad": found, "minutes": 4.0,
                         "steps": [vars(s) for s in steps]})
    assert said[0].startswith("first bad commit: c2")
    assert "  c1 vs good: like good (gates undecided: cpu-ddp-ws2 tokens_per_s inconclusive 0.981" in said[2]


def test_an_undecided_step_runs_again_with_more_rounds_before_it_is_passed_over():
    commits = ["c0", "c1", "c2", "c3"]
    truth = {"c0": 1.0, "c1": 0.722, "c2": 0.722, "c3": 0.722}
    judge, calls = measured(truth, first_look={"c1": (0.85, 0.70, 1.03)})  # straddles the midpoint
    found, steps, _ = search(commits, "good", judge)
    assert found == "c1"
    assert ("c1", "good", True) in calls  # the second try, with more rounds, decided it
    assert [s.like for s in steps if s.commit == "c1" and s.against == "good"] == ["undecided", "bad"]


def test_a_change_spread_over_three_commits_is_named_as_a_range():
    """Three 4% commits (c3, c4, c5) make 0.885 together: the search finds the first commit past half of
    the effect, but against its parent it moved 4%, like GOOD: no one commit is named, the range is."""
    commits = [f"c{i}" for i in range(8)]
    truth = dict(zip(commits, [1.0, 1.0, 1.0, 0.96, 0.96**2, 0.96**3, 0.96**3, 0.96**3], strict=True))
    judge, _ = measured(truth, width=0.01)
    found, steps, spread = search(commits, "good", judge)
    assert found is None and (steps[-1].commit, steps[-1].against, steps[-1].like) == ("c4", "c3", "good")
    first, last = spread.split("..")
    assert (first == "good" or commits.index(first) <= 2) and commits.index(last) >= 5  # all three
    said = lines({"range": "good..c7", "commits": commits, "first_bad": None, "spread": spread,
                         "minutes": 5.0, "steps": [vars(s) for s in steps]})
    assert said[0].startswith(f"no single commit made the change: it is spread over {spread}")


def test_a_commit_whose_session_stores_no_verdict_is_skipped_at_once_not_retried():
    commits = ["c0", "c1", "c2", "c3"]
    truth = {"c0": 1.0, "c1": 1.0, "c2": 1.0, "c3": 0.722}
    judge, calls = measured(truth)

    def broken_c1(commit, against, more_rounds=False):
        if commit == "c1":
            calls.append((commit, against, more_rounds))
            return Step(commit, against, *bisect.judged(None, 3, "", "ImportError: no harness"), 0.1)
        return judge(commit, against, more_rounds)

    found, steps, _ = search(commits, "good", broken_c1)
    assert found == "c3" and [c for c, _, _ in calls].count("c1") == 1
    assert next(s for s in steps if s.commit == "c1").like == "skipped"


def test_the_range_must_be_good_dot_dot_bad_on_one_line_of_history(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    for i in range(3):
        (tmp_path / "f").write_text(str(i))
        git("add", "f")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
    head, first = git("rev-parse", "HEAD"), git("rev-parse", "HEAD~2")
    assert bisect.parse_range("HEAD~2..HEAD", "flag", tmp_path) == (first, head)
    assert len(bisect.commits_between(tmp_path, first, head)) == 2
    for raw, said in [("HEAD", "is not GOOD..BAD"), ("HEAD~2..nope", "'nope' is not a commit"),
                      ("HEAD..HEAD~2", "is not an ancestor"), ("HEAD..HEAD", "holds no commit after HEAD")]:
        with pytest.raises(pytest.UsageError, match=said):
            bisect.parse_range(raw, "command line --llmbench-bisect", tmp_path)


def test_a_step_gets_the_command_line_without_the_drivers_own_options():
    args = ["-m", "cpu", "--llmbench-bisect", "a..b", "--llmbench-output=out", "--llmbench-ab=ref=x",
            "--llmbench-fail-below=tokens_per_s:5%", "--llmbench-output", "o2", "--llmbench-history-bisect"]
    assert bisect.strip_own(args) == ["-m", "cpu", "--llmbench-fail-below=tokens_per_s:5%"]


def test_a_step_is_judged_from_its_sessions_stored_verdicts():
    def gates(*outcomes: str, suite=()) -> dict:
        return {"cases": {f"case{i}": {"tokens_per_s": {"outcome": o, "ratio": 0.9, "low": 0.85, "high": 0.93,
                                                        "rounds": 8}} for i, o in enumerate(outcomes)},
                "side_failures": {}, "suite_failures": list(suite)}

    assert bisect.judged(gates("pass", "fail"), 1, "")[0] == "bad"
    assert bisect.judged(gates("pass", "pass"), 0, "")[0] == "good"
    assert bisect.judged(gates("pass", "pass", suite=["suite test: ..."]), 1, "")[0] == "bad"
    assert bisect.judged(gates("pass", "inconclusive"), 0, "")[0] == "undecided"
    outcome, why = bisect.judged(None, 4, "ERROR: usage\n")
    assert outcome == "skipped" and "exit 4: ERROR: usage" in why
    # a step's own error, from its stderr: it was "exit 4: no output"
    outcome, why = bisect.judged(None, 4, "", "ERROR: profile file x.toml: cannot read\n")
    assert "exit 4: ERROR: profile file x.toml: cannot read" in why
    early = gates("pass")  # a pass at the first look: the interval's upper end was once 300 digits
    early["cases"]["case0"]["tokens_per_s"]["high"] = 1.01e300
    assert bisect.judged(early, 0, "")[1] == "case0 tokens_per_s pass 0.900 (0.850 to above 1000, 8 rounds)"


def test_a_stopped_bisect_keeps_the_steps_it_ran():
    commits = [f"c{i}" for i in range(5)]
    judge, _ = judge_with(2, commits)
    calls = []

    def judge_then_stop(commit: str, against: str, more_rounds: bool = False) -> Step:
        calls.append(commit)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped by SIGTERM")
        return judge(commit, against, more_rounds)

    steps: list[bisect_search.Step] = []
    with pytest.raises(KeyboardInterrupt):
        search(commits, "good", judge_then_stop, steps)
    assert [s.commit for s in steps] == ["c4"]
    summary = {"range": "good..c4", "commits": commits, "first_bad": None, "minutes": 1.0,
               "stopped": "stopped by SIGTERM", "steps": [vars(s) for s in steps]}
    assert lines(summary)[0] == ("stopped after 1 step(s) (stopped by SIGTERM); the steps so far "
                                        "are kept")


def test_history_bisect_takes_the_latest_change_that_made_a_gated_metric_worse(tmp_path):
    """report/history.py's change point (a 10% drop at session 12 of 20: tests/unit/test_history.py)
    becomes the range last good..first bad; a drop within the allowed one, a flat history, or a change
    between sessions of one commit (the runner changed, not the code) is nothing to bisect, said."""
    from tests.unit.test_history import store_of

    said = []
    dropped = store_of(tmp_path / "drop", [1.0] * 11 + [0.9] * 9)
    found = bisect.from_history(str(dropped), [("tokens_per_s", 5.0)], said.append)
    assert found == "11cccccccccc..12cccccccccc"
    assert "tokens_per_s -1" in said[-1] and "(11cccccccccc..12cccccccccc)" in said[-1]
    assert bisect.from_history(str(dropped), [("tokens_per_s", 15.0)], said.append) is None
    assert said[-1].endswith("nothing to bisect")
    assert bisect.from_history(str(dropped), [("peak_memory_gib", 5.0)], said.append) is None
    with pytest.raises(pytest.UsageError, match="no history to bisect"):
        bisect.from_history(str(tmp_path / "empty"), [("tokens_per_s", 5.0)], said.append)
    rose = store_of(tmp_path / "rise", [1.0] * 11 + [1.1] * 9)  # faster is no regression
    assert bisect.from_history(str(rose), [("tokens_per_s", 5.0)], said.append) is None
    one = store_of(tmp_path / "one", [1.0] * 11 + [0.9] * 9)
    for path in (one / "results").glob("*/*.json"):  # every session of one commit
        data = json.loads(path.read_text())
        data["env"]["git_commit"] = "f" * 40
        path.write_text(json.dumps(data))
    assert bisect.from_history(str(one), [("tokens_per_s", 5.0)], said.append) is None
    assert "no commit range to bisect" in said[-1]


def test_history_bisect_from_the_command_line_runs_the_bisect_on_that_range(tmp_path, monkeypatch):
    """The flag as a user types it: the range goes to the same bisect --llmbench-bisect runs (its A/B
    steps are tests/plugin/test_ab.py's), named by where the flag came from; both at once is refused."""
    from tests.unit.test_history import store_of

    store_of(tmp_path / "out", [1.0] * 11 + [0.9] * 9)
    called = []
    monkeypatch.setattr(bisect, "run",
                        lambda config, span, where, output, cap: called.append((span, where, cap)) or 0)
    monkeypatch.chdir(tmp_path)
    args = ["-p", "no:cacheprovider", "--llmbench-output=out", "--llmbench-fail-below=tokens_per_s:5%"]
    assert pytest.main([*args, "--llmbench-history-bisect"]) == 0
    assert called == [("11cccccccccc..12cccccccccc", "command line --llmbench-history-bisect", 32)]
    assert pytest.main([*args, "--llmbench-history-bisect", "--llmbench-trials-max=48"]) == 0
    assert called[-1][2] == 48  # the step's round cap, doubled for an undecided step's second try
    monkeypatch.setenv("LLMBENCH_HISTORY_BISECT", "1")
    assert pytest.main([*args, "--llmbench-bisect", "a..b"]) == pytest.ExitCode.USAGE_ERROR


def _repo(tmp_path, files_per_commit):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    for i, files in enumerate(files_per_commit):
        for name in files:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(str(i))
            git("add", name)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
    return git


def test_a_commit_without_the_harness_is_skipped_by_name_and_never_run(tmp_path):
    """It was judged with the worktree's copy of another harness and stored under its own id."""
    git = _repo(tmp_path, [["f"]])
    step = bisect.ab_step(tmp_path, git("rev-parse", "HEAD"), "x", [], tmp_path / "out")
    assert step.outcome == "skipped" and "no harness/ at this commit" in step.why
    assert not (tmp_path / "out").exists()


def test_a_signal_mid_step_ends_its_process_group_and_removes_its_worktree(tmp_path, monkeypatch):
    """SIGTERM (as Ctrl-C) while a step's session runs: the session and everything it started end, the
    worktree is gone. The step here is a session that starts a child and sleeps."""
    import os
    import signal
    import sys
    import threading
    import time

    git = _repo(tmp_path, [["harness/__init__.py"]])
    marker = tmp_path / "child.pid"
    stub = (f"import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    monkeypatch.setattr(bisect, "STOP_GRACE_S", 2.0)
    monkeypatch.setattr(bisect.sys, "executable", sys.executable)
    real_popen = bisect.subprocess.Popen

    def session(argv, **kw):  # the step's pytest session only; git runs as itself
        return real_popen([sys.executable, "-c", stub] if argv[1:3] == ["-m", "pytest"] else argv, **kw)

    monkeypatch.setattr(bisect.subprocess, "Popen", session)
    threading.Timer(3, os.kill, args=(os.getpid(), signal.SIGINT)).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            bisect.ab_step(tmp_path, git("rev-parse", "HEAD"), "x", [], tmp_path / "out")
    finally:
        signal.signal(signal.SIGINT, previous)
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:  # gone, or a zombie nobody has reaped yet (its state in /proc)
            if open(f"/proc/{child}/stat").read().split(") ")[1][0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the step session's child outlived the stopped step")
    assert git("worktree", "list").count("\n") == 0  # only the main worktree


@pytest.mark.parametrize(("cv", "burners", "right_at_least"), [(0.05, 0.5, 0.95), (0.15, 0.5, 0.80)])
def test_on_a_noisy_runner_the_bisect_names_a_20_percent_regression(cv, burners, right_at_least):
    """experiments/bisect-noise/simulate.py's runner (launch noise cv, drift, a burner in half the steps),
    the steps' rounds through gates.sequential: a 20% slowdown in a 12-commit range is named at least as
    often as issue 66 asks (95% at cv 5% with a burner, 80% at cv 15%), on 300 seeded bisects."""
    import random

    from tests.unit.test_gates import experiment

    simulate = experiment("bisect-noise")

    rng = random.Random(f"test-{cv}")
    right = [simulate.bisect_once(rng, 12, cv, burners, use_effect=True)[0] for _ in range(300)]
    print(f"cv {cv:.0%}, burner in {burners:.0%} of steps: right {sum(right) / len(right):.1%} of 300")
    assert sum(right) / len(right) >= right_at_least
