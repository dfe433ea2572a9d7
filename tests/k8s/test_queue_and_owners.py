"""Kueue admission and preemption, owned objects, RBAC and Pod Security admission, against the real
control plane: Kueue's own controller (Workloads read at v1beta2), the real garbage collector and TTL
controller, the API server's own Forbidden and Pod Security answers."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.k8s.conftest import admitted, evicted_not_rerun, launch, left_behind, running_pods, workloads_seen
from tests.plugin.conftest import DATA, SUITE

QUOTA = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: cpu-nodes}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: benchmarks}
spec:
  namespaceSelector: {}
  resourceGroups:
    - coveredResources: [cpu, memory]
      flavors:
        - name: cpu-nodes
          resources:
            - {name: cpu, nominalQuota: "4"}
            - {name: memory, nominalQuota: 16Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: starved}
spec:
  namespaceSelector: {}
  resourceGroups:
    - coveredResources: [cpu, memory]
      flavors:
        - name: cpu-nodes
          resources:
            - {name: cpu, nominalQuota: "1"}
            - {name: memory, nominalQuota: 16Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: contended}
spec:
  namespaceSelector: {}
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
    - coveredResources: [cpu, memory]
      flavors:
        - name: cpu-nodes
          resources:
            - {name: cpu, nominalQuota: "2"}
            - {name: memory, nominalQuota: 16Gi}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: urgent}
value: 1000
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-c, namespace: llmbench}
spec: {clusterQueue: contended}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-a, namespace: llmbench}
spec: {clusterQueue: benchmarks}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-b, namespace: llmbench}
spec: {clusterQueue: starved}
"""
QUEUED = {"queue": "team-a", "queue_timeout_s": 60, "labels": {"cost-center": "ml-42"},
          "annotations": {"example.com/ticket": "BENCH-7"}}


@pytest.fixture(scope="module")
def queues(kube):
    kube.apply(QUOTA)
    return kube


def workloads(kube) -> list[dict]:
    return json.loads(kube.kubectl("get", "workloads.v1beta2.kueue.x-k8s.io", "-n", "llmbench",
                                   "-o", "json").stdout)["items"]


def test_a_queued_case_waits_for_kueue_and_runs_once_admitted(queues, cluster, launcher, tmp_path):
    """Kueue (not the launcher) resumes the Job once its Workload is admitted under the ClusterQueue's
    quota; the launcher only reads the Workload, at v1beta2."""
    lines = []
    with workloads_seen(cluster) as seen:
        result = launch(launcher, tmp_path, placement=QUEUED, progress=lines.append)
    assert result.ok, result.describe_failure()
    ran = admitted(seen)
    assert ran and ran[0]["status"]["admission"]["clusterQueue"] == "benchmarks"
    assert ran[0]["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]


def test_a_case_never_admitted_is_recorded_with_kueues_reason(queues, cluster, launcher, tmp_path):
    """A ClusterQueue with less quota than the case asks for: Kueue's own message, as it writes it."""
    result = launch(launcher, tmp_path, placement={"queue": "team-b", "queue_timeout_s": 8})
    assert result.status == "timeout"
    assert result.error.startswith("not admitted: queued in Kueue LocalQueue team-b for ")
    assert "Kueue's reason: Pending: couldn't assign flavors to pod set" in result.error
    # Kueue 0.17's own words (the fake's were an older Kueue's "insufficient unused quota ... more needed")
    assert "insufficient quota for cpu in flavor cpu-nodes" in result.error
    assert "current podset request (2) > maximum capacity (1)" in result.error


def test_a_queue_kueue_does_not_know_is_named(queues, cluster, launcher, tmp_path):
    result = launch(launcher, tmp_path, placement={"queue": "no-such-queue", "queue_timeout_s": 5})
    assert result.status == "timeout" and "Kueue's reason:" in result.error


def test_a_case_kueue_evicts_mid_run_is_recorded_not_rerun(queues, cluster, launcher, tmp_path):
    """Kueue re-suspends an admitted Job when it evicts its Workload (here: deactivated, as an admin or
    a preempting workload would); the launcher records it and deletes the rest."""
    def deactivate():
        end = time.monotonic() + 90
        while time.monotonic() < end:
            if len(running_pods(cluster, "k8s-evicted-1")) == 2:
                for w in workloads(cluster):
                    cluster.kubectl("patch", "workloads.v1beta2.kueue.x-k8s.io", w["metadata"]["name"], "-n",
                                    "llmbench", "--type", "merge", "-p", '{"spec":{"active":false}}')
                return
            time.sleep(0.3)

    thread = threading.Thread(target=deactivate)
    thread.start()
    result = launch(launcher, tmp_path, placement=QUEUED, env={"LLMBENCH_FAULT": "0:hang"},
                    run_id="k8s-evicted-1")
    thread.join()
    evicted_not_rerun(result)


URGENT = """
apiVersion: batch/v1
kind: Job
metadata:
  name: urgent
  namespace: llmbench
  labels: {kueue.x-k8s.io/queue-name: team-c, kueue.x-k8s.io/priority-class: urgent}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: c
          image: x
          command: ["python", "-c", "pass"]
          resources: {requests: {cpu: "2", memory: 1Gi}}
"""


def test_a_case_preempted_by_a_higher_priority_workload_is_recorded_not_rerun(queues, cluster, launcher,
                                                                               tmp_path):
    """Kueue's own preemption: a ClusterQueue with room for one case, the case running, then a Job of a
    higher WorkloadPriorityClass queued for the same quota: Kueue evicts the case's Workload and suspends
    its Job again; the launcher records that and deletes the rest."""
    stop = threading.Event()

    def submit_urgent():
        end = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < end:
            if len(running_pods(cluster, "k8s-preempted-1")) == 2:
                cluster.apply(URGENT)
                return
            time.sleep(0.3)

    thread = threading.Thread(target=submit_urgent)
    thread.start()
    try:
        result = launch(launcher, tmp_path, placement={"queue": "team-c", "queue_timeout_s": 60},
                        env={"LLMBENCH_FAULT": "0:hang"}, run_id="k8s-preempted-1")
    finally:
        stop.set()
        thread.join()
        cluster.kubectl("delete", "job", "urgent", "-n", "llmbench", "--ignore-not-found", "--wait=false")
    # Kueue's own reason, read from the case's Workload
    evicted_not_rerun(result, "Preempted: ")


def test_a_sigkilled_session_leaves_nothing_once_its_job_is_gone(cluster, tmp_path):
    """pytest SIGKILLed mid-case runs no clean-up: the Job ends by itself (its own deadline bounds it),
    the TTL controller deletes it, and the garbage collector deletes what it owned."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "tinycpu.toml").write_text((DATA / "tinycpu.toml").read_text() + "\n[k8s]\nttl_s = 1\n")
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", "tinycpu and k8s", "--llmbench-profile-file=tinycpu.toml",
         "--strategy=ddp", "--world-size=2", "--llmbench-launcher=k8s", "-p", "no:cacheprovider",
         f"--llmbench-k8s-kubeconfig={cluster.launcher_kubeconfig}", "--llmbench-output=out",
         "--llmbench-timeout=40"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "LLMBENCH_FAULT": "0:hang"})
    deadline = time.monotonic() + 120
    running = []
    while not running and time.monotonic() < deadline and session.poll() is None:
        running = running_pods(cluster)
        time.sleep(0.3)
    assert running, "the case's pods started"
    os.killpg(session.pid, signal.SIGKILL)
    session.wait()
    kinds = {o.split("/")[0] for o in left_behind(cluster, wait_s=0)}
    assert {"Job", "ConfigMap", "Service", "NetworkPolicy"} <= kinds  # nobody deleted them
    # the Job's activeDeadlineSeconds ends it, ttlSecondsAfterFinished deletes it, the GC the rest
    assert left_behind(cluster, wait_s=150) == []


def test_the_role_grants_what_the_launcher_uses_and_a_missing_verb_is_named(kube, cluster, launcher,
                                                                            tmp_path):
    """The project's Role, applied as shipped, is enough (every other test runs with it). Without one of
    its verbs the API server's Forbidden is the case's reason."""
    role = json.loads(kube.kubectl("get", "role", "llmbench-launcher", "-n", "llmbench", "-o", "json").stdout)
    original = json.dumps({"rules": role["rules"]})
    rules = [dict(r) for r in role["rules"]]
    for rule in rules:
        if rule["resources"] == ["pods/log"]:
            rule["verbs"] = ["list"]  # no get: the logs cannot be read
    kube.kubectl("patch", "role", "llmbench-launcher", "-n", "llmbench", "--type", "merge",
                 "-p", json.dumps({"rules": rules}))
    try:
        time.sleep(1)
        result = launch(launcher, tmp_path)
    finally:
        kube.kubectl("patch", "role", "llmbench-launcher", "-n", "llmbench", "--type", "merge",
                     "-p", original)
    assert result.status == "error"
    assert "403" in result.error and "Forbidden" in result.error and "pods/log" in result.error, result.error


def test_pods_pod_security_refuses_fail_the_case_with_the_api_servers_words(kube, launcher, tmp_path):
    """A namespace that enforces Pod Security "baseline" refuses the RDMA pods (host network, privileged,
    root); the case fails with the API server's own message, and the case's default pods pass even
    "restricted"."""
    kube.kubectl("create", "namespace", "llmbench-baseline")
    try:
        kube.kubectl("label", "namespace", "llmbench-baseline", "pod-security.kubernetes.io/enforce=baseline")
        kube.apply(subprocess.run([sys.executable, "-m", "pytest_llmbench.launchers.k8s.manifests", "setup",
                                   "--namespace", "llmbench-baseline"], capture_output=True, text=True,
                                  check=True).stdout)
        token = kube.token("llmbench-baseline", "llmbench-launcher")
        launcher.kubeconfig = str(kube._kubeconfig(tmp_path / "baseline.kubeconfig", {"token": token}))
        launcher.namespace = "llmbench-baseline"
        spec_env = {"LLMBENCH_DEVICE_CHECK": "0"}
        result = launch(launcher, tmp_path, env=spec_env,
                        placement={"rdma": "BM.GPU.H100.8", "host_network": True,
                                   "host_network_reason": "test", "schedule_timeout_s": 30})
        assert result.status == "error"
        assert "the API server refused the case's pods" in result.error
        assert 'violates PodSecurity "baseline:latest"' in result.error, result.error
    finally:
        kube.kubectl("delete", "namespace", "llmbench-baseline", "--wait=false")
