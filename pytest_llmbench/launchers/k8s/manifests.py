"""Render the Kubernetes objects of a case from the jinja2 templates in ``k8s/``.

Pure functions (no cluster, no kubernetes import): the launcher creates what they
return, and the tests validate it against the Kubernetes JSON schemas.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from harness.spec import RunSpec
from pytest_llmbench.launchers.k8s import rdma as k8s_rdma
from pytest_llmbench.launchers.k8s.values import dns_label, placement_problem

TEMPLATES = Path(os.environ.get("LLMBENCH_K8S_TEMPLATES", Path(__file__).parents[2] / "k8s_templates"))
PORT = 29500
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue manages a Job that carries it (Kueue's docs, run/jobs)


class PlacementError(ValueError):
    """A profile's [k8s] table is invalid; the message names the profile and key."""


@dataclass(frozen=True)
class Placement:
    """Where and how a case's pods run: the profile's [k8s] table plus the launcher's settings."""

    image: str
    namespace: str = "llmbench"
    pull_secret: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    cpu: str | None = None
    memory: str | None = None
    shm_size: str = "1Gi"
    extra_resources: dict[str, Any] = field(default_factory=dict)
    host_network: bool = False
    host_network_reason: str = ""
    rdma: str | None = None  # an OCI shape of k8s_rdma.NETWORKS: cases that span nodes use its RDMA
    schedule_timeout_s: float = 300.0  # unschedulable for this long ends the case
    rendezvous_timeout_s: float = 600.0  # all pods running but no step for this long ends it
    ttl_s: int = 3600
    queue: str | None = None  # a Kueue LocalQueue: the Job waits, suspended, until Kueue admits it
    queue_timeout_s: float = 900.0  # not admitted for this long ends the case ("not admitted")
    priority_class: str | None = None  # the pods' PriorityClass (Kueue orders its queue by it too)
    labels: dict[str, str] = field(default_factory=dict)  # on every object and pod
    annotations: dict[str, str] = field(default_factory=dict)  # on the Job and its pods
    # The image carries a C compiler and Python.h, which torch.compile needs (Triton's launcher on CUDA,
    # inductor's C++ kernels on CPU). The project's images have neither: `compile` cases are refused.
    image_compiler: bool = False

    @classmethod
    def from_profile(cls, table: dict[str, Any], *, source: str, **settings: Any) -> Placement:
        """The profile's [k8s] table, every value checked (k8s_values) before it can reach a
        manifest; ``settings`` (image, namespace, pull secret) are checked where they are read."""
        problem = placement_problem(table)
        if problem:
            key, value, rule = problem
            raise PlacementError(f"profile {source}: key 'k8s.{key}': {value!r} {rule}")
        if table.get("host_network") and not table.get("host_network_reason"):
            raise PlacementError(f"profile {source}: key 'k8s.host_network': set host_network_reason "
                                 f"to say why this profile needs the host's network")
        return cls(**settings, **table)


def object_name(run_id: str) -> str:
    """A DNS-1123 label for every object of the run, short enough that a pod hostname
    ``<name>-<index>`` stays within 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    return ("llmb-" + name)[:52].rstrip("-")


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render_case(spec: RunSpec, *, run_id: str, placement: Placement, env: dict[str, str],
                timeout_s: float) -> list[dict[str, Any]]:
    """The Indexed Job of one case, suspended, then its ConfigMap, headless Service and NetworkPolicy:
    the launcher creates the Job first and makes it the owner of the others (``owned_by``)."""
    name = object_name(run_id)
    rdma = k8s_rdma.NETWORKS[placement.rdma] if placement.rdma and spec.nnodes > 1 else None
    if rdma:  # the shape's NCCL settings, under the profile's own [env]
        env = {**rdma.nccl_env(), **env}
    labels = {**placement.labels, "app.kubernetes.io/part-of": "pytest-llmbench",
              "app.kubernetes.io/component": "benchmark", "llmbench.dev/run": name,
              "llmbench.dev/strategy": spec.strategy, "llmbench.dev/world-size": str(spec.world_size)}
    queued = {QUEUE_LABEL: placement.queue} if placement.queue else {}
    values = dict(name=name, service=name, run_label=name, namespace=placement.namespace, labels=labels,
                  job_labels={**labels, **queued}, annotations=placement.annotations,
                  priority_class=placement.priority_class,
                  run_id=run_id, spec_json=spec.dumps(), port=PORT, nnodes=spec.nnodes,
                  nproc_per_node=spec.nproc_per_node, deadline_s=math.ceil(timeout_s) + 30,
                  ttl_s=placement.ttl_s, host_network=placement.host_network or bool(rdma), rdma=bool(rdma),
                  node_selector=placement.node_selector, tolerations=placement.tolerations,
                  pull_secret=placement.pull_secret, image=placement.image, env=env,
                  shm_size=placement.shm_size, **_resources(spec, placement))
    text = _env().get_template("job.yaml.j2").render(values) + "\n---\n" + \
        _env().get_template("run.yaml.j2").render(values)
    import yaml

    return [_joined(doc) for doc in yaml.safe_load_all(text) if doc]


def owned_by(obj: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """``obj`` owned by the created ``job`` (its uid from the API server): the cluster's garbage
    collector deletes it with the Job, whatever happens to the launcher. No ``blockOwnerDeletion``:
    setting it needs the right to update the Job's finalizers, which the launcher's Role lacks."""
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"], "controller": True}
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [owner]}}


def _joined(value: Any) -> Any:
    """``value`` with each UTF-16 surrogate pair made the character it encodes. The templates write
    strings with ``tojson``, which escapes a character outside the BMP as a pair (``\\ud83d\\ude80``),
    and PyYAML reads such a pair as two lone surrogates: a profile's emoji reached the pod as two
    halves that no UTF-8 encoder takes."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16") if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {_joined(k): _joined(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_joined(v) for v in value]
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def render_setup(namespace: str) -> list[dict[str, Any]]:
    """Namespace, the launcher's ServiceAccount, Role and RoleBinding (one-time admin set-up)."""
    import yaml

    return [doc for doc in yaml.safe_load_all(_env().get_template("setup.yaml.j2").render(
        namespace=namespace)) if doc]


def _resources(spec: RunSpec, placement: Placement) -> dict[str, dict[str, Any]]:
    per_pod = spec.nproc_per_node
    if spec.device == "cuda":
        amounts = {placement.gpu_resource: per_pod, **placement.extra_resources}
    else:
        amounts = {}
    amounts["cpu"] = placement.cpu or str(per_pod * max(1, spec.threads_per_rank))
    amounts["memory"] = placement.memory or "4Gi"
    return {"requests": dict(amounts), "limits": dict(amounts)}


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_llmbench.launchers.k8s.manifests setup --namespace NS``: print the
    one-time set-up objects as YAML for an admin to review and ``kubectl apply -f -``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pytest_llmbench.launchers.k8s.manifests",
                                     description=main.__doc__.split(":")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="Namespace, ServiceAccount, Role and RoleBinding as YAML")
    setup.add_argument("--namespace", default="llmbench")
    args = parser.parse_args(argv)
    rule = dns_label(args.namespace)
    if rule:
        parser.error(f"--namespace {args.namespace!r}: {rule}")
    import yaml

    print(yaml.safe_dump_all(render_setup(args.namespace), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
