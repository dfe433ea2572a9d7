"""Kueue admission and owned objects, against the fake API server (its Kueue, garbage collector and
TTL controller: tests/k8s/fake_cluster.py)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.k8s.conftest import launch
from tests.k8s.fake_cluster import FakeCluster
from tests.plugin.conftest import DATA, SUITE

QUEUED = {"queue": "team-a", "queue_timeout_s": 60, "priority_class": "benchmarks",
          "labels": {"cost-center": "ml-42"}, "annotations": {"example.com/ticket": "BENCH-7"}}


def test_a_queued_case_waits_for_kueue_and_runs_once_admitted(cluster, launcher, tmp_path):
    cluster.faults["kueue"] = {"admit_after_s": 2.0}
    lines = []
    result = launch(launcher, tmp_path, placement=QUEUED, progress=lines.append)
    assert result.ok, result.describe_failure()
    assert "queued in Kueue LocalQueue team-a: Pending: couldn't assign flavors to pod set main: " \
           "insufficient unused quota for nvidia.com/gpu in flavor a10, 2 more needed" in lines
    job = cluster.created[0]
    assert job["spec"]["suspend"] is False  # resumed by (the fake's) Kueue, not by the launcher
    assert not [m for m, p in cluster.requests if m == "PATCH"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert all(o["metadata"]["labels"]["cost-center"] == "ml-42" for o in cluster.created[:4])
    pod = job["spec"]["template"]
    assert pod["spec"]["priorityClassName"] == "benchmarks"
    assert pod["metadata"]["annotations"] == job["metadata"]["annotations"] == QUEUED["annotations"]
    assert cluster.objects == {} and cluster.live_processes() == []  # its Workload went with the Job


@pytest.mark.parametrize("kueue, said", [
    ({}, "Kueue's reason: Pending: couldn't assign flavors to pod set main: insufficient unused quota"),
    (None, "Kueue's reason: no Workload yet (is Kueue installed, and does it manage this namespace"),
], ids=["no-quota", "no-kueue"])
def test_a_case_never_admitted_is_recorded_with_kueues_reason(cluster, launcher, tmp_path, kueue, said):
    if kueue is not None:
        cluster.faults["kueue"] = kueue
    result = launch(launcher, tmp_path, placement={"queue": "team-a", "queue_timeout_s": 1.5})
    assert result.status == "timeout"
    assert result.error.startswith("not admitted: queued in Kueue LocalQueue team-a for ")
    assert said in result.error and "(queue_timeout_s 1.5)" in result.error
    assert cluster.objects == {} and cluster.pods == {}


def test_a_sigkilled_session_leaves_nothing_once_its_job_is_gone(tmp_path):
    """pytest SIGKILLed mid-case runs no clean-up: the Job ends by itself (its own deadline bounds it),
    its TTL deletes it, and the garbage collector deletes what it owned."""
    cluster = FakeCluster(tmp_path / "pods")
    try:
        kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
        (tmp_path / "test_suite.py").write_text(SUITE)
        (tmp_path / "tinycpu.toml").write_text((DATA / "tinycpu.toml").read_text() + "\n[k8s]\nttl_s = 1\n")
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-m", "tinycpu and k8s", "--llmbench-profile-file=tinycpu.toml",
             "--strategy=ddp", "--world-size=2", "--llmbench-launcher=k8s", "-p", "no:cacheprovider",
             f"--llmbench-k8s-kubeconfig={kubeconfig}", "--llmbench-output=out"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while not cluster.live_processes() and time.monotonic() < deadline and session.poll() is None:
            time.sleep(0.1)
        assert cluster.live_processes(), "the case's pods started"
        os.killpg(session.pid, signal.SIGKILL)
        session.wait()
        kinds = sorted(kind for kind, _ in cluster.objects)
        assert kinds == ["ConfigMap", "Job", "NetworkPolicy", "Service"]  # nobody deleted them
        while (cluster.objects or cluster.live_processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster.objects == {} and cluster.live_processes() == []
        assert not [m for m, _ in cluster.requests if m == "DELETE"]  # the cluster's doing, not pytest's
    finally:
        cluster.close()
