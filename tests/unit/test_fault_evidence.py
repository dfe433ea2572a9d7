"""What a failure is called: only what was observed (OOM counters, step lines, /proc)."""

import os
import subprocess
import sys
import time

from harness.spec import RunSpec
from pytest_llmbench.launchers import oom, procs
from pytest_llmbench.launchers.base import death
from pytest_llmbench.launchers.local.launcher import _collect
from pytest_llmbench.launchers.progress import RankProgress, last_steps

SPEC = RunSpec.from_preset("tiny", world_size=2, seq_len=64, steps=4, warmup_steps=1)
NO_RESULT_LOG = ("Root Cause (first observed failure):\n[1]:\n  time      : 2026-11-22_21:10:45\n"
                 "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 1)\n")


def test_counter_files_for_cgroup_v2_v1_and_the_host(tmp_path):
    v2 = oom.counter_files("0::/user.slice/job\n", root=tmp_path)
    assert v2[0] == tmp_path / "user.slice/job/memory.events" and v2[-1].name == "vmstat"
    v1 = oom.counter_files("4:memory:/process_api/abc\n1:cpu:/\n", root=tmp_path)
    assert v1[:2] == [tmp_path / "memory/process_api/abc/memory.oom_control",
                      tmp_path / "memory/memory.oom_control"]


def test_read_counts_and_evidence(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    before = oom.read_counts([events, tmp_path / "missing"])
    assert before == {str(events): 1}
    assert oom.evidence(before, oom.read_counts([events])) is None
    events.write_text("oom_kill 2\n")
    assert oom.evidence(before, oom.read_counts([events])) == (
        f"the OOM killer's count in {events} rose from 1 to 2 during the case")
    assert oom.read_counts()  # this host has at least /proc/vmstat


def test_sigkill_is_oom_only_with_evidence():
    assert death(-9, "the OOM killer's count in /proc/vmstat rose from 0 to 1 during the case") == (
        "oom", "killed by SIGKILL; the OOM killer's count in /proc/vmstat rose from 0 to 1 during the case")
    status, words = death(-9, None)
    assert status == "error" and words.startswith("killed by SIGKILL (cause unknown")
    assert death(-15, None) == ("error", "killed by SIGTERM")
    assert death(3, None) == ("error", "exit code 3")


def test_a_sigkilled_rank_with_no_result_is_oom_only_with_evidence(tmp_path):
    (tmp_path / "torchrun.log").write_text(NO_RESULT_LOG)
    plain = _collect(SPEC, tmp_path, "r", rc=1, status="finished", reason="")
    assert plain.status == "error" and "rank 1 killed by SIGKILL (cause unknown" in plain.error
    seen = _collect(SPEC, tmp_path, "r", rc=1, status="finished", reason="",
                    oom_evidence="the OOM killer's count in x rose from 0 to 1 during the case")
    assert seen.status == "oom" and seen.failed_rank == 1


def test_step_lines_of_every_rank():
    log = ("llmbench train step 1/5 warmup time_s=0.1\nllmbench[1] train step 2/5 warmup\n"
           "llmbench[1] compute-only step 1/3 warmup\nnoise\nllmbench train step 2/5 warmup\n")
    assert last_steps(log) == {0: "train step 2/5", 1: "compute-only step 1/3"}
    assert last_steps("llmbench train step 4/5 measure", default_rank=3) == {3: "train step 4/5"}


def test_progress_window_follows_the_step_time():
    ranks = RankProgress()
    ranks.update({0: "train step 1/9", 1: "train step 1/9"}, now=0.0)
    ranks.update({0: "train step 2/9", 1: "train step 1/9"}, now=20.0)  # rank 0: 20 s a step
    assert ranks.making_progress(0, now=70.0)  # within 3 x 20 s
    assert not ranks.making_progress(1, now=70.0)  # 70 s since its last step; window 10 s
    assert not ranks.making_progress(2, now=70.0)  # never printed a step
    summary = ranks.summary(range(3), now=70.0, facts={1: "process stopped by a signal"})
    assert summary == ("ranks making progress: rank 0 (train step 2/9, 50.0 s ago); not making progress: "
                       "rank 1 (train step 1/9, 70.0 s ago; process stopped by a signal), "
                       "rank 2 (no step line yet)")


def test_processes_are_found_by_their_mark_and_ended_even_when_stopped():
    mark = f"fault-evidence-{os.getpid()}"
    stop_self = "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"
    child = subprocess.Popen([sys.executable, "-c", stop_self],
                             env={**os.environ, "LLMBENCH_RUN_ID": mark}, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not [p for p in procs.find("LLMBENCH_RUN_ID", mark) if p.state == "T"]:
            assert time.monotonic() < deadline, "the child never stopped"
            time.sleep(0.05)
        [found] = procs.find("LLMBENCH_RUN_ID", mark)
        assert found.pid == child.pid and procs.describe(found).startswith(f"pid {child.pid} (stopped")
        assert [p.pid for p in procs.end_all("LLMBENCH_RUN_ID", mark)] == [child.pid]
        assert child.wait(timeout=5) == -9
        assert procs.find("LLMBENCH_RUN_ID", mark) == []
    finally:
        child.kill()


def test_a_pod_killed_with_sigkill_is_oom_only_if_the_kubelet_says_oomkilled():
    from pytest_llmbench.launchers.k8s.verdicts import pod_verdict

    def pod(reason, code):
        state = {"terminated": {"exitCode": code, "reason": reason}}
        return {"metadata": {"name": "p-1", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
                "status": {"phase": "Failed", "containerStatuses": [{"state": state}]}}

    assert pod_verdict(pod("OOMKilled", 137)) == ("oom", "pod p-1 was OOMKilled (container memory limit)")
    status, words = pod_verdict(pod("Error", 137))
    assert status == "error" and words.startswith("pod p-1 (node rank 1) exited 137 (SIGKILL; cause unknown")
    assert pod_verdict(pod("Error", 1)) == ("error", "pod p-1 (node rank 1) exited 1")


def test_the_slowdown_knob_reads_its_fraction_and_names_a_bad_one(monkeypatch):
    import pytest

    from harness.faults import slowdown

    monkeypatch.delenv("LLMBENCH_SLOWDOWN", raising=False)
    assert slowdown(0) == 0.0
    monkeypatch.setenv("LLMBENCH_SLOWDOWN", "0.25")
    assert slowdown(0) == slowdown(3) == 0.25
    monkeypatch.setenv("LLMBENCH_SLOWDOWN", "1:0.5")  # one straggler
    assert (slowdown(0), slowdown(1)) == (0.0, 0.5)
    for bad in ("fast", "x:0.5", "1:fast", "-0.1"):
        monkeypatch.setenv("LLMBENCH_SLOWDOWN", bad)
        with pytest.raises(ValueError, match=f"LLMBENCH_SLOWDOWN='{bad}'"):
            slowdown(0)


def test_the_fault_knob_injects_each_listed_rank_its_own_fault(monkeypatch, capsys):
    import pytest

    from harness.faults import maybe_inject

    monkeypatch.setenv("LLMBENCH_FAULT", "0:exitnot,1:raise,3:nope")
    maybe_inject(2)  # not named: nothing happens
    assert capsys.readouterr().out == ""
    with pytest.raises(RuntimeError, match="injected failure on rank 1"):
        maybe_inject(1)
    with pytest.raises(ValueError, match="unknown kind 'nope'"):
        maybe_inject(3)
    with pytest.raises(ValueError, match="unknown kind 'exitnot'"):
        maybe_inject(0)
