"""A/B in one session (--llmbench-ab, gates.py): a candidate 3x slower (LLMBENCH_SLOWDOWN=2 exported
in the shell, so every rank of this session has it) against a baseline side whose env=FILE sets it to
0 (the file wins over the shell on the baseline side only). Each round runs both sides, candidate
first in odd rounds and second in even ones, each on its own warm ranks; the gate reads each round's
paired ratio and fails the case, naming the side, the rounds and the bounds. Both sides' results are
stored (the baseline's apart, under ab-baseline/, with both sides' facts in _ab.json), the terminal
says the session's error rate, and the report has an A/B section with the paired ratio."""

import json
import re
import subprocess

import pytest

from pytest_llmbench import ab


def test_a_slower_candidate_fails_against_its_baseline_side_in_one_session(suite, monkeypatch):
    (suite.path / "fast.env").write_text("# the baseline side runs at full speed\nLLMBENCH_SLOWDOWN=0\n")
    # the candidate: each step sleeps twice its time, a drop no busy CI worker's noise hides in 4 rounds
    # (one earlier at 0.5 and 3 rounds ended undecided beside the other worker)
    monkeypatch.setenv("LLMBENCH_SLOWDOWN", "2")
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-ab=env=fast.env", "--llmbench-fail-below=tokens_per_s:5%", "--llmbench-trials=4",
        "--llmbench-trials-max=4", "--llmbench-output=out", "-p", "no:cacheprovider", "-s")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    # failed at its one look (4 rounds), then confirmed by a block of 4 more
    said = re.search(r"tokens_per_s A/B over 8 round\(s\) against env=fast.env, allowed drop 5%: "
                     r"new/old = ([\d.]+)", out)
    assert said and float(said.group(1)) < 0.6, out[-2000:]
    assert ("error budget: a session of clean cases fails anywhere at most 2% of the time; 1 regression "
            "gate(s) (cases x metrics)") in out
    assert "A/B against env=fast.env; looks at 4 rounds" in out  # planned before the first round
    # the rounds alternate: candidate first in round 1 and 3, the baseline first in round 2
    order = ["B" if "[baseline env=fast.env]" in line else "C" for line in out.splitlines()
             if "launching on local" in line]
    assert order == ["C", "B", "B", "C"] * 4
    assert "confirmed by a confirming block of 4 more rounds" in out
    (session,) = (suite.path / "out" / "results").iterdir()
    candidates = sorted(p.name for p in session.glob("tinycpu-*.json"))
    baselines = sorted(p.name for p in (session / "ab-baseline").glob("*.json"))
    assert candidates == baselines == [f"tinycpu-ddp-ws1-seq64{t}.json"
                                       for t in (*(f"-trial{k}" for k in range(2, 9)), "")]
    for name in candidates:
        cand = json.loads((session / name).read_text())
        base = json.loads((session / "ab-baseline" / name).read_text())
        assert cand["env"]["ab_side"] == "candidate" and base["env"]["ab_side"] == "baseline"
        assert base["env"]["ab"] == "env=fast.env" and cand["trial"] == base["trial"]
        assert cand["metrics"]["tokens_per_s"] < 0.6 * base["metrics"]["tokens_per_s"]
        assert cand["launch"]["pool"] != base["launch"]["pool"]  # each side on its own warm ranks
    verdicts = json.loads((session / "_gates.json").read_text())  # what --llmbench-bisect reads
    (case,) = verdicts["cases"].values()
    assert case["tokens_per_s"]["rounds"] == 8 and case["tokens_per_s"]["ratio"] < 0.6
    facts = json.loads((session / "_ab.json").read_text())
    assert facts["baseline"]["env"] == {"LLMBENCH_SLOWDOWN": "0"} and facts["candidate"]["torch"]
    report = (suite.path / "out" / "report" / "REPORT.md").read_text()
    section = report.split("## A/B (paired rounds)\n")[1].split("\n## ")[0]
    assert f"| {session.name} | tinycpu-ddp-ws1-seq64 | 8 |" in section
    assert re.search(r"\| 0\.[0-5]\d\d \(", section)  # the paired ratio, below 0.6


def test_a_ref_side_runs_its_worktrees_harness_with_a_relative_output(suite):
    """ref=HEAD: the baseline's ranks start in a worktree of HEAD (removed at the end); the run
    folders are given to them as absolute paths, so a relative --llmbench-output still finds their
    results (a relative one once left every baseline result in the worktree)."""
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-ab=ref=HEAD", "--llmbench-trials=2", "--llmbench-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    (session,) = (suite.path / "out" / "results").iterdir()
    bases = [json.loads(p.read_text()) for p in (session / "ab-baseline").glob("*.json")]
    assert len(bases) == 2 and all(b["status"] == "ok" and b["env"]["ab"] == "ref=HEAD" for b in bases)
    verdicts = json.loads((session / "_gates.json").read_text())  # no gate asked: none recorded
    assert list(verdicts["cases"].values()) == [{}] and verdicts["suite_failures"] == []
    facts = json.loads((session / "_ab.json").read_text())
    assert facts["baseline"]["commit"] == facts["candidate"]["commit"]
    assert not (suite.path / "out" / "ab").exists()  # the worktree is elsewhere (pytest would collect it)
    listed = subprocess.run(["git", "-C", str(ab.ROOT), "worktree", "list"], capture_output=True, text=True)
    assert session.name not in listed.stdout  # and gone
