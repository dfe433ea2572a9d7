"""The launcher against the real control plane (tests/k8s/conftest.py), through the real client,
manifests and harness, with the least-privilege kubeconfig."""

import os
import signal
import threading
import time

import pytest

from harness.result import BenchResult
from pytest_llmbench.launchers import Interrupted
from pytest_llmbench.launchers.k8s import cluster as k8s_cluster
from pytest_llmbench.launchers.k8s.verdicts import first_failure
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from tests.k8s.conftest import launch, running_pods, two_node_spec
from tests.k8s.real_cluster import ApiFaults


def test_two_node_case_matches_the_local_launcher_and_runs_hsdp(cluster, launcher, tmp_path):
    """The real Job controller makes the Indexed Job's pods, the real scheduler binds them to the two
    nodes, the pods find each other by the headless Service's names, and the logs come back through the
    API server; the launcher's Role is all it has."""
    lines = []
    result = launch(launcher, tmp_path, progress=lines.append)
    assert result.ok, result.describe_failure()
    assert result.spec.nnodes == 2 and result.env["nnodes"] == 2
    assert (tmp_path / "run" / "pod-0.log").exists() and (tmp_path / "run" / "pod-1.log").exists()
    assert "kind: Job" in (tmp_path / "run" / "manifests.yaml").read_text()
    local = LocalLauncher().run(two_node_spec(nnodes=1), run_dir=tmp_path / "local", run_id="local",
                                timeout_s=90, env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    assert local.ok
    assert result.losses == pytest.approx(local.losses, abs=1e-5)  # same ranks, same math
    assert result.metrics["tokens_per_step"] == local.metrics["tokens_per_step"]
    # variant hsdp, multi-node only: FSDP2 on a (2 nodes x 1 rank) replicate x shard mesh, on DDP's curve
    hsdp = launcher.run(two_node_spec(strategy="fsdp", variant="hsdp"), run_dir=tmp_path / "hsdp",
                        run_id="k8s-hsdp-abc123", timeout_s=120, env={"DS_ACCELERATOR": "cpu"},
                        progress=lambda _: None)
    assert hsdp.ok, hsdp.describe_failure()
    assert hsdp.strategy_config["device_mesh"] == "(2, 1) ('replicate', 'shard')"
    assert hsdp.losses == pytest.approx(local.losses, abs=2e-3)


def test_a_rank_that_exits_1_fails_the_case_with_its_traceback(cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:raise"})
    assert result.status == "error"
    assert result.failed_rank == 1
    assert "injected failure on rank 1" in result.error
    assert "--- pod 1 ---" in result.log_tail


def test_a_pod_that_never_schedules_is_named_with_the_schedulers_words(cluster, launcher, tmp_path):
    """GPUs the nodes do not have: the real scheduler's message."""
    result = launch(launcher, tmp_path, two_node_spec(), placement={"schedule_timeout_s": 2,
                                                                     "cpu": "64"})
    assert result.status == "error"
    assert "unschedulable for 2 s: 0/2 nodes are available: 2 Insufficient cpu" in result.error


def test_a_rank_that_hangs_mid_run_times_out(cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, timeout_s=25)
    assert result.status == "timeout" and "no result after 25 s" in result.error


def test_a_lost_pod(cluster, launcher, tmp_path):
    """A pod deleted by someone else mid-run (an admin, a node drain): the case says so."""
    def delete_a_pod():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            running = running_pods(cluster, "k8s-lost-abc123")
            if len(running) == 2:
                time.sleep(2)
                cluster.kubectl("delete", "pod", "-n", "llmbench", running[1]["metadata"]["name"],
                                "--wait=false")
                return
            time.sleep(0.3)

    thread = threading.Thread(target=delete_a_pod)
    thread.start()
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "0:hang"}, run_id="k8s-lost-abc123")
    thread.join()
    assert result.status == "error"
    # the node agent stops it as a kubelet does (SIGTERM, then the pod goes): either is named, whatever
    # torchrun's exit code on SIGTERM (1 or 143, by when it came)
    assert "was deleted while it ran" in result.error or "disappeared" in result.error, result.error


def test_ctrl_c_mid_case_deletes_everything(cluster, launcher, tmp_path):
    """A real SIGINT (what Ctrl-C sends) while pods run; rank 1 hangs so the case cannot finish."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(8, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(Interrupted) as info:
            launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, timeout_s=90)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert info.value.result.status == "error"
    assert "Ctrl-C" in info.value.result.error


def test_the_earliest_rank_failure_is_the_cause_whatever_the_pod_order():
    spec = two_node_spec()
    peer = BenchResult.failure(spec, status="error", run_id="r", failed_rank=0,
                               error="rank 0: RuntimeError: Connection closed by peer",
                               created_utc="2026-01-01T00:00:01.500000+00:00")
    cause = BenchResult.failure(spec, status="error", run_id="r", failed_rank=1,
                                error="rank 1: RuntimeError: injected failure on rank 1",
                                created_utc="2026-01-01T00:00:01.200000+00:00")
    assert first_failure([peer, cause]) is cause
    assert first_failure([cause, peer]) is cause


def test_dropped_connections_and_bursts_of_429_and_503_are_retried_and_the_case_completes(
        cluster, launcher, tmp_path, monkeypatch):
    """A flaky, then busy API server, in one case, through a fault-injecting proxy in front of the real
    one: the next five requests have their connection closed without a word, the six after answer 429
    with Retry-After or 503 without, and every call is retried (k8s_cluster.Cluster._call). The back-off
    here starts at 0.05 s and stops doubling at 0.4 s (production's 0.5 s and 10 s are held by the next
    test)."""
    monkeypatch.setattr(k8s_cluster, "BACKOFF_S", 0.05)
    monkeypatch.setattr(k8s_cluster, "BACKOFF_MAX_S", 0.4)
    proxy = ApiFaults(cluster.server, cluster.certs.root / "ca.crt")
    try:
        launcher.kubeconfig = str(proxy.kubeconfig(cluster.launcher_kubeconfig, tmp_path / "proxied"))
        proxy.drop = 5
        proxy.errors = [(429, 1), (503, None), (503, None), (429, 0), (503, None), (429, 1)]
        result = launch(launcher, tmp_path)
        assert result.ok, result.describe_failure()
        assert proxy.sent == [0] * 5 + [429, 503, 503, 429, 503, 429]
    finally:
        proxy.close()


def test_the_back_off_doubles_from_half_a_second_to_ten_and_waits_what_retry_after_says(monkeypatch):
    """Cluster._call's waits on production's constants: 0.5 s doubling to 10 s with up to 25% jitter on
    connection errors and a bare 503, Retry-After's seconds on a 429."""
    from kubernetes.client import ApiClient
    from kubernetes.client.exceptions import ApiException

    waits = []
    monkeypatch.setattr(k8s_cluster.time, "sleep", waits.append)
    failures = [OSError("reset")] * 6 + [ApiException(status=503), ApiException(status=429)]
    failures[-1].headers = {"Retry-After": "3"}

    def flaky():
        if failures:
            raise failures.pop(0)
        return "done"

    cluster = k8s_cluster.Cluster(ApiClient(), "llmbench")
    assert cluster._call(flaky) == "done" and cluster.retried == 8
    low = [0.5, 1, 2, 4, 8, 10, 10, 3]
    assert all(w <= x <= 1.25 * w for w, x in zip(low, waits, strict=True)), waits


def test_a_lasting_outage_fails_the_case_with_the_api_servers_words(cluster, launcher, tmp_path):
    """Every request 503 for longer than the case's timeout: the case fails by its deadline, saying the
    server's answer and how long it was retried; nothing was created."""
    proxy = ApiFaults(cluster.server, cluster.certs.root / "ca.crt")
    try:
        launcher.kubeconfig = str(proxy.kubeconfig(cluster.launcher_kubeconfig, tmp_path / "proxied"))
        proxy.errors = [(503, None)] * 12
        result = launch(launcher, tmp_path, timeout_s=4)
    finally:
        proxy.close()
    assert result.status == "error"
    assert "Kubernetes API: create_namespaced_job: 503 Service Unavailable" in result.error
    assert "the API server stayed unavailable until the case's deadline" in result.error
    assert result.wall_time_s < 15
