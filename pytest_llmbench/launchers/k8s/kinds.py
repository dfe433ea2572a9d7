"""The same case as another kind of workload (``--llmbench-k8s-kind``): the Indexed Job the templates
render (manifests.render_case), re-expressed as a JobSet or a Kubeflow Trainer TrainJob.

    job       batch/v1 Job, as rendered: the Job, its ConfigMap, headless Service and NetworkPolicy.
    jobset    jobset.x-k8s.io/v1alpha2 JobSet with one replicated Job ("node") whose template is the
              Job's spec. JobSet makes the headless Service itself (``network.subdomain``), so the
              launcher's is left out; the rank-0 pod is ``<name>-node-0-0.<name>``.
    trainjob  trainer.kubeflow.org/v1alpha1 TrainJob on the ``torch-distributed`` ClusterTrainingRuntime:
              the trainer's image, command, environment, nodes and resources. Trainer's torch plugin
              sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (``<name>-node-0-0.<name>``)
              and PET_MASTER_PORT itself and refuses a TrainJob that sets them
              (kubeflow/trainer pkg/runtime/framework/plugins/torch/torch.go, v2.3.0), so they are left
              out; the pods mount nothing of the launcher's, so the spec travels in the environment
              (``--spec env:LLMBENCH_SPEC_JSON``). Node selector, tolerations, pull secret and the
              one-pod-per-node spread go in ``runtimePatches`` (v2.3.0's API); the pods' PriorityClass,
              security context and volumes are the runtime's.

Each is validated against its project's published CRD schema (tests/k8s/crds/).
"""

from __future__ import annotations

import copy
from typing import Any

from harness.spec import RunSpec

KINDS = ("job", "jobset", "trainjob")
RUNTIME = "torch-distributed"  # Trainer's own ClusterTrainingRuntime for torchrun
REPLICA = "node"  # the runtime's replicated Job and container (Trainer's constants.Node)
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # JobSet puts it on every pod it makes
SPEC_ENV = "LLMBENCH_SPEC_JSON"


class KindError(ValueError):
    """A case or placement the kind cannot express."""


def as_kind(objects: list[dict[str, Any]], kind: str, *, spec: RunSpec) -> list[dict[str, Any]]:
    """The rendered Job's objects of ``spec`` as ``kind`` (the owner first, then what it owns)."""
    if kind == "job":
        return objects
    if kind == "jobset":
        return jobset(objects)
    if kind == "trainjob":
        return trainjob(objects, spec)
    raise KindError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


def pod_label(owner: dict[str, Any]) -> str:
    """The label whose value, the owner's name, selects the owner's pods."""
    return JOBSET_LABEL if owner["kind"] == "TrainJob" else "llmbench.dev/run"


def rank0_address(name: str) -> str:
    return f"{name}-{REPLICA}-0-0.{name}"


def jobset(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    job, configmap, _service, policy = objects
    name = job["metadata"]["name"]
    spec = copy.deepcopy(job["spec"])
    ttl = spec.pop("ttlSecondsAfterFinished")
    spec.pop("suspend")
    pod = spec["template"]["spec"]
    pod.pop("subdomain")  # JobSet sets the pods' hostname and subdomain
    for item in pod["containers"][0]["env"]:
        if item["name"] == "PET_MASTER_ADDR":
            item["value"] = rank0_address(name)
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": job["metadata"],
             "spec": {"suspend": True, "ttlSecondsAfterFinished": ttl,
                      "network": {"enableDNSHostnames": True, "subdomain": name,
                                  "publishNotReadyAddresses": True},
                      "failurePolicy": {"maxRestarts": 0},  # a static-world rendezvous is not re-run
                      "replicatedJobs": [{"name": REPLICA, "replicas": 1,
                                          "template": {"metadata": {"labels": job["metadata"]["labels"]},
                                                       "spec": spec}}]}}
    return [owner, configmap, policy]


def trainjob(objects: list[dict[str, Any]], spec: RunSpec) -> list[dict[str, Any]]:
    job, _configmap, _service, policy = objects
    name = job["metadata"]["name"]
    pod = job["spec"]["template"]["spec"]
    if pod.get("priorityClassName"):
        raise KindError("k8s.priority_class is set: a TrainJob's pods take their PriorityClass from the "
                        "training runtime (use a Kueue WorkloadPriorityClass label, or "
                        "--llmbench-k8s-kind=job)")
    if pod.get("hostNetwork"):
        raise KindError("k8s.host_network or k8s.rdma (a case across nodes) is set: a TrainJob's pods take "
                        "their network from the training runtime (use --llmbench-k8s-kind=job or jobset)")
    container = pod["containers"][0]
    env = [e for e in container["env"] if not e["name"].startswith("PET_")]
    env.append({"name": SPEC_ENV, "value": spec.dumps()})
    args = list(container["args"])
    args[args.index("--spec") + 1] = f"env:{SPEC_ENV}"
    args[args.index("--out") + 1] = f"/tmp/{name}-result.json"
    trainer = {"image": container["image"], "command": container["command"], "args": args, "env": env,
               "numNodes": spec.nnodes, "numProcPerNode": spec.nproc_per_node,
               "resourcesPerNode": container["resources"]}
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": job["metadata"],
             "spec": {"suspend": True, "runtimeRef": {"name": RUNTIME}, "trainer": trainer,
                      "activeDeadlineSeconds": job["spec"]["activeDeadlineSeconds"]}}
    patch = copy.deepcopy({k: pod[k] for k in ("nodeSelector", "tolerations", "imagePullSecrets", "affinity")
                           if k in pod})
    # /dev/shm as a memory volume, as the Job's and JobSet's pods have it: the runtime's container ("node")
    # would otherwise get the container runtime's 64 MiB, too little for NCCL between GPUs of one pod
    shm = [v for v in pod.get("volumes") or [] if v["name"] == "dshm"]
    if shm:
        patch["volumes"] = copy.deepcopy(shm)
        patch["containers"] = [{"name": REPLICA,
                                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    selector = {JOBSET_LABEL: name}  # Trainer's pods carry JobSet's label, not the launcher's
    for term in patch.get("affinity", {}).get("podAntiAffinity", {}).get(
            "preferredDuringSchedulingIgnoredDuringExecution", []):
        term["podAffinityTerm"]["labelSelector"]["matchLabels"] = selector
    if patch:
        replica = {"name": REPLICA, "template": {"spec": {"template": {"spec": patch}}}}
        owner["spec"]["runtimePatches"] = [{"manager": "llmbench.dev/launcher", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [replica]}}}}]
    policy = copy.deepcopy(policy)
    policy["spec"]["podSelector"]["matchLabels"] = selector
    policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] = selector
    return [owner, policy]
