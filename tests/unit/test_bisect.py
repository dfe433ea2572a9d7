"""``--llmbench-bisect`` apart from its A/B sessions (pytest_llmbench/bisect.py): the search over a
range with a judge drawn here, the range's usage errors on a real git repository, the command line a
step gets, and how a step's stored verdicts are read. The A/B session a step runs is the one
tests/plugin/test_ab.py runs."""

from __future__ import annotations

import json
import subprocess

import pytest

from pytest_llmbench import bisect


def judge_with(first_bad: int | None, commits: list[str], undecided: set[str] = frozenset()):
    tried = []

    def judge(commit: str, against: str) -> bisect.Step:
        tried.append((commit, against))
        bad = first_bad is not None and commits.index(commit) >= first_bad
        outcome = "undecided" if commit in undecided else "bad" if bad else "good"
        return bisect.Step(commit, against, outcome, "drawn", 1.0)

    return judge, tried


@pytest.mark.parametrize("first_bad", range(12))
def test_the_search_names_the_first_bad_commit_in_a_logarithmic_number_of_steps(first_bad):
    commits = [f"c{i:02d}" for i in range(12)]
    judge, tried = judge_with(first_bad, commits)
    found, steps = bisect.search(commits, "good", judge)
    assert found == commits[first_bad]
    assert len(steps) <= 2 + 4  # BAD, at most ceil(log2 12) halvings, the first bad against its parent
    assert tried[0] == ("c11", "good") and all(against == "good" for _, against in tried[:-1])
    assert tried[-1] == (commits[first_bad], commits[first_bad - 1] if first_bad else "good")


def test_a_range_without_a_regression_says_so_and_an_undecided_step_is_passed_over():
    commits = [f"c{i}" for i in range(5)]
    found, steps = bisect.search(commits, "good", judge_with(None, commits)[0])
    assert found is None and [s.outcome for s in steps] == ["good"]
    summary = {"range": "good..c4", "commits": commits, "first_bad": None, "minutes": 1.0,
               "steps": [vars(s) for s in steps]}
    assert bisect.lines(summary)[0].startswith("no regression in good..c4")
    # c1 cannot be judged: the search judges its neighbours instead and names the range left
    found, steps = bisect.search(commits, "good", judge_with(1, commits, undecided={"c1"})[0])
    assert found is None and [s.commit for s in steps] == ["c4", "c1", "c2", "c0"]
    assert bisect.lines({**summary, "steps": [vars(s) for s in steps]})[0] == (
        "no single commit named: the change lies in c0..c2 (2 commit(s): c1, c2); passed over: c1")
    # a skipped commit whose neighbour decides: the first bad one is still named
    found, steps = bisect.search(commits, "good", judge_with(3, commits, undecided={"c3"})[0])
    assert found is None and bisect.lines({**summary, "steps": [vars(s) for s in steps]})[0].startswith(
        "no single commit named: the change lies in c2..c4")
    found, steps = bisect.search(commits, "good", judge_with(4, commits, undecided={"c2"})[0])
    assert found == "c4" and "c2" in [s.commit for s in steps]


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
    assert outcome == "undecided" and "exit 4: ERROR: usage" in why
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

    def judge_then_stop(commit: str, against: str) -> bisect.Step:
        calls.append(commit)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped by SIGTERM")
        return judge(commit, against)

    steps: list[bisect.Step] = []
    with pytest.raises(KeyboardInterrupt):
        bisect.search(commits, "good", judge_then_stop, steps)
    assert [s.commit for s in steps] == ["c4"]
    summary = {"range": "good..c4", "commits": commits, "first_bad": None, "minutes": 1.0,
               "stopped": "stopped by SIGTERM", "steps": [vars(s) for s in steps]}
    assert bisect.lines(summary)[0] == ("stopped after 1 step(s) (stopped by SIGTERM); the steps so far "
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
    monkeypatch.setattr(bisect, "run", lambda config, span, where, output: called.append((span, where)) or 0)
    monkeypatch.chdir(tmp_path)
    args = ["-p", "no:cacheprovider", "--llmbench-output=out", "--llmbench-fail-below=tokens_per_s:5%"]
    assert pytest.main([*args, "--llmbench-history-bisect"]) == 0
    assert called == [("11cccccccccc..12cccccccccc", "command line --llmbench-history-bisect")]
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
