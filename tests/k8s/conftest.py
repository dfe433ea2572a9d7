"""The k8s launcher's tests run against a real control plane (tests/k8s/real_cluster.py,
tools/k8s_local.py): the upstream API server with RBAC and Pod Security admission, the job, garbage
collector and TTL controllers, the scheduler, Kueue, JobSet and Trainer, started once per session. The
launcher uses the least-privilege kubeconfig: a token of the ServiceAccount the project's Role binds.
Pods run on the emulated node agents (tools/k8s_node.py); tests/offline runs the launcher's kinds and
faults on a real kubelet (tools/k8s_kubelet.py) with the pod image."""

import json
import threading
import time
from contextlib import contextmanager

import pytest

from harness.spec import RunSpec
from pytest_llmbench.launchers.k8s.launcher import K8sLauncher
from tests.k8s import real_cluster
from tests.procs import MARK, no_process_outlives_its_test  # noqa: F401 - autouse, every test

TINY = dict(micro_batch=4, grad_accum=2, seq_len=64, steps=5, warmup_steps=2, threads_per_rank=1,
            compute_probe_steps=2, lr=3e-3, data_pool=16)
OWNED = "jobs,jobsets.jobset.x-k8s.io,trainjobs.trainer.kubeflow.org,configmaps,services,networkpolicies,pods"


def two_node_spec(**changes) -> RunSpec:
    """2 ranks on 2 "nodes" (pods), one rank each."""
    return RunSpec.from_preset("tiny", **{**TINY, "world_size": 2, "nnodes": 2, **changes})


@pytest.fixture(scope="session")
def kube(tmp_path_factory):
    cluster = real_cluster.start(tmp_path_factory.mktemp("kube"))
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def workloads_seen(kube, namespace: str = "llmbench"):
    """Every Workload Kueue writes in ``namespace`` while the block runs, read at v1beta2 every half
    second (a list that grows; Kueue deletes a case's Workload with its Job, so it is read as it goes)."""
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            out = kube.kubectl("get", "workloads.v1beta2.kueue.x-k8s.io", "-n", namespace, "-o", "json")
            seen.extend(json.loads(out.stdout)["items"])
            time.sleep(0.5)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def running_pods(kube, run_id: str | None = None, namespace: str = "llmbench") -> list[dict]:
    """The pods of case ``run_id`` (every case's where None) that run and are not being deleted: a
    previous case's pods still terminating show phase Running too, and counting them let a test act
    before its own case had started."""
    from pytest_llmbench.launchers.k8s.manifests import object_name

    select = ["-l", f"llmbench.dev/run={object_name(run_id)}"] if run_id else []
    out = kube.kubectl("get", "pods", "-n", namespace, *select, "-o", "json").stdout
    return [p for p in json.loads(out)["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def evicted_not_rerun(result, reason: str = "") -> None:
    """The case ended as an error that names Kueue's eviction (``reason``: Kueue's, e.g. Preempted) and
    was not re-run: seen mid-run (the Job suspended again) or between two of the launcher's looks while
    it waited for admission (the Workload's eviction count), whichever the timing gave."""
    assert result.status == "error", f"{result.status}: {result.error}"
    assert "a case is not re-run half-way" in result.error, result.error
    assert (f"suspended after it started (Kueue evicted it: {reason}" in result.error
            or f"Kueue evicted the Job's Workload ({reason}" in result.error), result.error


def admitted(seen: list[dict]) -> list[dict]:
    """The Workloads of ``seen`` whose Admitted condition is True."""
    return [w for w in seen if any(c["type"] == "Admitted" and c["status"] == "True"
                                   for c in w.get("status", {}).get("conditions", []))]


def left_behind(kube, wait_s: float = 60.0) -> list[str]:
    """The case objects still in the namespace after ``wait_s`` (deletion is the garbage collector's
    work once the owner is marked: foreground deletion returns before it is done)."""
    end = time.monotonic() + wait_s
    while True:
        out = kube.kubectl("get", OWNED, "-n", real_cluster.k8s_local.NAMESPACE, "-l", "llmbench.dev/run",
                           "-o", "json").stdout
        names = [f"{o['kind']}/{o['metadata']['name']}" for o in json.loads(out)["items"]]
        if not names or time.monotonic() > end:
            return names
        time.sleep(0.5)


@pytest.fixture
def cluster(kube):
    """The session's cluster; after the test, nothing of a case is left in its namespace."""
    yield kube
    assert left_behind(kube) == []


@pytest.fixture
def launcher(cluster, tmp_path):
    return K8sLauncher(namespace=real_cluster.k8s_local.NAMESPACE, image="llmbench/harness:test",
                       kubeconfig=str(cluster.launcher_kubeconfig), poll_s=0.3)


def launch(launcher, tmp_path, spec=None, *, env=None, timeout_s=120, placement=None, progress=None,
           run_id="k8s-case-abc123"):
    """One case; its pods carry this test's process mark, so a pod process left running fails the test."""
    import os

    launcher.placement = placement or {}  # the profile's [k8s] table
    return launcher.run(spec or two_node_spec(), run_dir=tmp_path / "run", run_id=run_id,
                        timeout_s=timeout_s,
                        env={"DS_ACCELERATOR": "cpu", MARK: os.environ.get(MARK, ""), **(env or {})},
                        progress=progress or (lambda line: None))
