"""The Slurm launcher against a real two-node Slurm cluster (tests/slurm/conftest.py): the real
sbatch, srun, squeue, scontrol and scancel, the real harness, two slurmd as two nodes; then the
plugin, the store and the report through it. One file, so that one test worker runs them all
against one cluster."""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.result import BenchResult
from pytest_llmbench.launchers import Interrupted
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from pytest_llmbench.launchers.slurm.launcher import Placement, job_info
from tests.plugin.conftest import DATA, SUITE
from tests.slurm.conftest import launch, squeue, two_node_spec

pytest_plugins = "pytester"

LOSS_TOLERANCE = 2e-3  # tests/harness/test_strategies.py: strategies agree to 4 decimals


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory) -> BenchResult:
    """The same two ranks on one host with the local launcher: the curve every Slurm run follows."""
    root = tmp_path_factory.mktemp("local")
    result = LocalLauncher().run(two_node_spec(nnodes=1), run_dir=root / "run", run_id="local-ref",
                                 timeout_s=90, env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    assert result.ok, result.describe_failure()
    return result


def wait_for_state(job: str, states: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = job_info(job)
        if info.get("JobState") in states:
            return info
        time.sleep(0.2)
    raise AssertionError(f"job {job} not in {states} after {timeout_s} s: {job_info(job)}")


def wait_for_training(run_dir, timeout_s: float = 60) -> str:
    """The job id once rank 0 has started training (its node log shows a step)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = " ".join(p.read_text(errors="replace") for p in run_dir.glob("node-*.log"))
        found = list(run_dir.glob("rendezvous-*"))
        if found and ("llmbench train step" in logs or "fault injected" in logs):
            return found[0].name.split("-")[1].split(".")[0]
        time.sleep(0.2)
    raise AssertionError(f"no training step in {run_dir} after {timeout_s} s")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero3"])
def test_two_node_batch_job_matches_the_local_launcher(cluster, tmp_path, local_reference, strategy):
    lines = []
    result = launch(tmp_path, two_node_spec(strategy=strategy), progress=lines.append)
    assert result.ok, result.describe_failure()
    assert result.spec.nnodes == 2 and result.env["nnodes"] == 2
    assert result.env["slurm"]["mode"] == "batch" and result.env["slurm"]["job"].isdigit()
    assert any(line.startswith("batch mode: submitted job") for line in lines)
    assert result.losses == pytest.approx(local_reference.losses, abs=LOSS_TOLERANCE)
    assert result.metrics["tokens_per_step"] == local_reference.metrics["tokens_per_step"]
    run = tmp_path / "run"
    # every rank's log is kept: each node's agent output, and torchrun's file per rank
    nodes = sorted(p.name for p in run.glob("node-*.log"))
    assert nodes == ["node-0.log", "node-1.log"]
    assert {p.parent.parent.parent.parent.name for p in run.glob("logs/*/*/attempt_0/0/stdout.log")} == \
        {"n1", "n2"}
    assert "LLMBENCH_RESULT_BEGIN" in " ".join(p.read_text() for p in run.glob("node-*.log"))
    assert json.loads((run / "result.json").read_text())["status"] == "ok"


def test_the_result_is_read_from_the_node_logs_without_result_json(cluster, tmp_path):
    """result.json is one way; the checksummed markers in the node logs are the other."""
    from pytest_llmbench.launchers.slurm.logs import collect

    result = launch(tmp_path)
    assert result.ok
    (tmp_path / "run" / "result.json").unlink()
    again = collect(result.spec, tmp_path / "run", result.run_id, "finished", "", "batch",
                    result.env["slurm"]["job"])
    assert again.ok and again.losses == result.losses


def test_a_step_inside_an_allocation(cluster, tmp_path, monkeypatch, local_reference):
    """Under salloc: the case is a step of the allocation, which outlives it untouched."""
    out = subprocess.run(["salloc", "--no-shell", "-N2", "--job-name=llmbench-test-allocation"],
                         capture_output=True, text=True, timeout=60)
    allocation = next(w for w in out.stderr.split() if w.isdigit())
    try:
        monkeypatch.setenv("SLURM_JOB_ID", allocation)
        lines = []
        result = launch(tmp_path, progress=lines.append)
        assert result.ok, result.describe_failure()
        assert result.env["slurm"] == {"mode": "step", "job": f"{allocation}.0"}
        assert lines[0].startswith(f"step mode: a step of allocation {allocation}")
        assert result.losses == pytest.approx(local_reference.losses, abs=LOSS_TOLERANCE)
        steps = subprocess.run(["squeue", "-h", "-s", "-j", allocation], capture_output=True, text=True)
        assert steps.stdout.strip() == ""  # no step left
        assert job_info(allocation)["JobState"] == "RUNNING"  # the allocation is the user's
    finally:
        subprocess.run(["scancel", allocation], timeout=30)
        wait_for_state(allocation, {"CANCELLED", "COMPLETED"})
        deadline = time.monotonic() + 30
        while any(line.startswith(allocation) for line in squeue()) and time.monotonic() < deadline:
            time.sleep(0.2)


def test_a_rank_that_fails_is_blamed_with_its_traceback(cluster, tmp_path):
    result = launch(tmp_path, env={"LLMBENCH_FAULT": "1:raise"})
    assert result.status == "error" and result.failed_rank == 1
    assert "injected failure on rank 1" in result.error
    assert "failed (exit code" in result.error  # Slurm's word on the job
    assert "injected failure on rank 1" in result.log_tail


def test_a_node_that_goes_down_mid_case(cluster, tmp_path):
    holder = {}
    thread = threading.Thread(target=lambda: holder.update(
        r=launch(tmp_path, env={"LLMBENCH_FAULT": "1:hang"})))
    thread.start()
    try:
        wait_for_training(tmp_path / "run")
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=llmbench-test"],
                       check=True, timeout=30)
        thread.join(timeout=90)
    finally:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True, timeout=30)
        deadline = time.monotonic() + 60
        sinfo = ["sinfo", "-h", "-n", "n2", "-p", "debug", "-o", "%t"]
        while "idle" not in subprocess.run(sinfo, capture_output=True, text=True).stdout \
                and time.monotonic() < deadline:
            time.sleep(0.5)
    result = holder["r"]
    assert result.status == "error"
    assert "lost a node (NODE_FAIL)" in result.error and "NodeDown" in result.error


def test_a_job_that_never_starts_says_why(cluster, tmp_path):
    """Pending past queue_timeout_s: Slurm's reason (the partition is down), then cancelled."""
    started = time.monotonic()
    result = launch(tmp_path, placement=Placement(partition="closed", queue_timeout_s=3))
    assert result.status == "timeout"
    assert "never started: pending for" in result.error and "PartitionDown" in result.error
    assert time.monotonic() - started < 30


def test_a_requeued_job_is_recorded_and_cancelled(cluster, tmp_path):
    holder = {}
    thread = threading.Thread(target=lambda: holder.update(
        r=launch(tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, placement=Placement(requeue=True))))
    thread.start()
    job = wait_for_training(tmp_path / "run")
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    thread.join(timeout=90)
    result = holder["r"]
    assert result.status == "error"
    assert f"job {job} was requeued by Slurm after it had started" in result.error


def test_a_rejected_submission_is_a_result(cluster, tmp_path):
    result = launch(tmp_path, placement=Placement(partition="nosuchpartition"))
    assert result.status == "error"
    assert "sbatch rejected the job" in result.error and "nosuchpartition" in result.error


def test_ctrl_c_mid_case_cancels_the_job(cluster, tmp_path):
    """A real SIGINT while the job runs; rank 1 hangs so the case cannot finish."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Thread(target=lambda: (wait_for_training(tmp_path / "run"),
                                             os.kill(os.getpid(), signal.SIGINT)))
    timer.start()
    try:
        with pytest.raises(Interrupted) as info:
            launch(tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, timeout_s=60)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    result = info.value.result
    assert "Ctrl-C" in result.error and "cancelled" in result.error
    job = result.env["slurm"]["job"]
    assert job_info(job).get("JobState") in (None, "CANCELLED")


def test_slurm_kills_a_case_at_its_time_limit(cluster):
    """The background case of conftest.TimeLimitCase: a hung rank, Slurm's one-minute limit."""
    timed = cluster.time_limit_case
    timed.join(timeout=150)
    assert not timed.is_alive()
    result = timed.result
    assert result is not None, (timed.root / "case.err").read_text()[-2000:]
    assert result.status == "timeout"
    assert "was killed by Slurm at its time limit" in result.error and "00:01:00" in result.error

# -- the plugin: pytest --llmbench-launcher=slurm ------------------------------------------------


def test_launcher_slurm_without_slurm_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # python, pytest; no sbatch
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("--llmbench-launcher=slurm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmbench-launcher=slurm (command line --llmbench-launcher): "
                                 "sbatch, srun, scontrol, squeue, scancel not found on PATH*"])


def test_slurm_cases_are_stored_and_reported_beside_local_ones(cluster, pytester):
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "tinycpu.toml").write_text((DATA / "tinycpu.toml").read_text())
    common = ["-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=2",
              "--llmbench-output=out", "-p", "no:cacheprovider"]
    local = pytester.runpytest_subprocess(*common)
    local.assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess(*common, "--llmbench-launcher=slurm")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*tinycpu-ddp-ws1-seq64: launching on slurm*",
                                 "*tinycpu-ddp-ws2-seq64: batch mode: submitted job *",
                                 "tinycpu-ddp-ws2-seq64 * ok"])
    stored = sorted((pytester.path / "out" / "results").glob("*/tinycpu-ddp-ws2-seq64.json"))
    launchers = [json.loads(p.read_text())["env"]["launcher"] for p in stored]
    assert sorted(launchers) == ["local", "slurm"]
    report = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=out",
                                           "-p", "no:cacheprovider")
    assert report.ret == 0
    rows = list(csv.DictReader((pytester.path / "out" / "report" / "metrics.csv").open()))
    seen = {(r["strategy"], r["launcher"], r["world_size"]) for r in rows}
    assert seen == {("ddp", "local", "1"), ("ddp", "local", "2"), ("ddp (slurm)", "slurm", "1"),
                    ("ddp (slurm)", "slurm", "2")}
    efficiency = {(r["launcher"], r["world_size"]): r["scaling_efficiency"] for r in rows}
    assert all(float(efficiency[(launcher, "2")]) > 0 for launcher in ("local", "slurm"))
    text = (pytester.path / "out" / "report" / "REPORT.md").read_text()
    assert "| ddp (slurm) |" in text and "| ddp |" in text
