"""The launcher against a fake API server, through the real client, manifests and harness."""

import os
import signal
import threading

import pytest

from harness.result import BenchResult
from pytest_llmbench.launchers import Interrupted, k8s_cluster
from pytest_llmbench.launchers.k8s import first_failure
from pytest_llmbench.launchers.local import LocalLauncher
from tests.k8s.conftest import launch, two_node_spec


def assert_cleaned_up(cluster):
    assert cluster.objects == {}, "every created object is deleted"
    assert cluster.live_processes() == []


def test_two_node_case_matches_the_local_launcher_and_runs_hsdp(cluster, launcher, tmp_path):
    lines = []
    result = launch(launcher, tmp_path, progress=lines.append)
    assert result.ok, result.describe_failure()
    assert result.spec.nnodes == 2 and result.env["nnodes"] == 2
    assert (tmp_path / "run" / "pod-0.log").exists() and (tmp_path / "run" / "pod-1.log").exists()
    assert "kind: Job" in (tmp_path / "run" / "manifests.yaml").read_text()
    assert_cleaned_up(cluster)
    # the Job first, suspended; it owns the rest (the garbage collector's part); then it is resumed
    job, *owned = cluster.created
    assert [o["kind"] for o in cluster.created] == ["Job", "ConfigMap", "Service", "NetworkPolicy"]
    assert [o["metadata"]["ownerReferences"][0]["uid"] for o in owned] == [job["metadata"]["uid"]] * 3
    assert [m for m, p in cluster.requests if p.endswith("/jobs/" + job["metadata"]["name"])][:1] == ["PATCH"]
    local = LocalLauncher().run(two_node_spec(nnodes=1), run_dir=tmp_path / "local", run_id="local",
                                timeout_s=90, env={"DS_ACCELERATOR": "cpu"}, progress=lambda _: None)
    assert local.ok
    assert result.losses == pytest.approx(local.losses, abs=1e-5)  # same ranks, same math
    assert result.metrics["tokens_per_step"] == local.metrics["tokens_per_step"]
    # variant hsdp, multi-node only: FSDP2 on a (2 nodes x 1 rank) replicate x shard mesh, on DDP's curve
    hsdp = launcher.run(two_node_spec(strategy="fsdp", variant="hsdp"), run_dir=tmp_path / "hsdp",
                        run_id="k8s-hsdp-abc123", timeout_s=90, env={"DS_ACCELERATOR": "cpu"},
                        progress=lambda _: None)
    assert hsdp.ok, hsdp.describe_failure()
    assert hsdp.strategy_config["device_mesh"] == "(2, 1) ('replicate', 'shard')"
    assert hsdp.losses == pytest.approx(local.losses, abs=2e-3)
    assert_cleaned_up(cluster)


def test_a_rank_that_exits_1_fails_the_case_with_its_traceback(cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:raise"})
    assert result.status == "error"
    assert result.failed_rank == 1
    assert "injected failure on rank 1" in result.error
    assert "--- pod 1 ---" in result.log_tail
    assert_cleaned_up(cluster)


def test_a_rank_that_dies_without_a_word_is_blamed_not_its_peer(cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:exit"})
    assert result.status == "error" and result.failed_rank == 1
    assert result.error.startswith("rank 1 died (exit code 3) without recording a failure; then rank 0")
    assert_cleaned_up(cluster)


def test_a_pod_that_never_schedules(cluster, launcher, tmp_path):
    cluster.faults["unschedulable"] = True
    result = launch(launcher, tmp_path, placement={"schedule_timeout_s": 1})
    assert result.status == "error"
    assert "unschedulable for 1 s: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu" in result.error
    assert_cleaned_up(cluster)


def test_an_image_that_cannot_be_pulled(cluster, launcher, tmp_path):
    cluster.faults["image_error"] = True
    result = launch(launcher, tmp_path)
    assert result.status == "error" and "ErrImagePull: manifest unknown" in result.error
    assert_cleaned_up(cluster)


def test_a_hung_rendezvous(cluster, launcher, tmp_path):
    # 25 s: starting two ranks (torch import, process group) takes ~6 s idle and twice that on
    # a loaded CI host (15 s was once not enough there); the hang must be reached, and logged,
    # before the launcher gives up.
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "0:hang"},
                    placement={"rendezvous_timeout_s": 25})
    assert result.status == "timeout"
    assert "rendezvous hung" in result.error
    assert "fault injected on rank 0" in result.log_tail
    assert_cleaned_up(cluster)


def test_a_rank_that_hangs_mid_run_times_out(cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, timeout_s=15)
    assert result.status == "timeout" and "no result after 15 s" in result.error
    assert ("ranks making progress: none; not making progress: rank 0 (no step line yet), "
            "rank 1 (no step line yet)") in result.error
    assert_cleaned_up(cluster)


@pytest.mark.parametrize("fault, message", [("tamper_log", "sha256"), ("truncate_log", "truncated")])
def test_a_damaged_result_in_the_log_is_refused(cluster, launcher, tmp_path, fault, message):
    cluster.faults[fault] = True
    result = launch(launcher, tmp_path)
    assert result.status == "error"
    assert "result in the pod log is unusable" in result.error and message in result.error
    assert (tmp_path / "run" / "pod-0.log").exists()
    assert_cleaned_up(cluster)


def test_a_lost_pod(cluster, launcher, tmp_path):
    cluster.faults["lose_pod_after_s"] = 4
    result = launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "0:hang"})
    assert result.status == "error"
    assert "disappeared" in result.error
    assert_cleaned_up(cluster)


def test_ctrl_c_mid_case_deletes_everything(cluster, launcher, tmp_path):
    """A real SIGINT (what Ctrl-C sends) while pods run; rank 1 hangs so the case cannot finish."""
    # A runner started in the background (`cmd &` without job control) ignores SIGINT, and so
    # does this process then: Ctrl-C's behaviour is what is tested, so give it back for the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(5, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(Interrupted) as info:
            launch(launcher, tmp_path, env={"LLMBENCH_FAULT": "1:hang"}, timeout_s=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert info.value.result.status == "error"
    assert "Ctrl-C" in info.value.result.error
    assert_cleaned_up(cluster)


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
    """A flaky, then busy API server, in one case: the next five requests have their connection closed
    without a word (a load balancer restarting, an apiserver rollout), carried by urllib3's own retries
    and then Cluster._call's; the six after answer 429 with Retry-After or 503 without, and every call
    is retried (k8s_cluster.Cluster._call). The case runs and nothing is left. The back-off here starts
    at 0.05 s and stops doubling at 0.4 s, not 0.5 s and 10 s: eleven failures of one call (the Job's
    create) would wait ~50 s, and what is tested is that each is retried. Retry-After's seconds are
    still waited as the server says."""
    monkeypatch.setattr(k8s_cluster, "BACKOFF_S", 0.05)
    monkeypatch.setattr(k8s_cluster, "BACKOFF_MAX_S", 0.4)
    cluster.faults["drop"] = 5
    cluster.faults["api_errors"] = [(429, 1), (503, None), (503, None), (429, 0), (503, None), (429, 1)]
    result = launch(launcher, tmp_path)
    assert result.ok, result.describe_failure()
    assert [code for _, _, code in cluster.errors_sent] == [0] * 5 + [429, 503, 503, 429, 503, 429]
    assert_cleaned_up(cluster)


def test_the_back_off_doubles_from_half_a_second_to_ten_and_waits_what_retry_after_says(monkeypatch):
    """Cluster._call's waits on production's constants (the case above shortens them): 0.5 s doubling
    to 10 s with up to 25% jitter on connection errors and a bare 503, Retry-After's seconds on a 429."""
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
    server's answer and how long it was retried; nothing was created, nothing is left."""
    cluster.faults["api_errors"] = [(503, None)] * 12
    result = launch(launcher, tmp_path, timeout_s=4)
    assert result.status == "error"
    assert "Kubernetes API: create_namespaced_job: 503 Service Unavailable" in result.error
    assert "the API server stayed unavailable until the case's deadline" in result.error
    assert result.wall_time_s < 15
    assert_cleaned_up(cluster)
