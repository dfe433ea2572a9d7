"""Kubernetes launcher: one case = one Indexed Job (plus ConfigMap, headless Service,
NetworkPolicy), created with the official client, watched until it ends, its result
taken from the rank-0 log between the checksummed markers, every pod's log saved, and
every object deleted again on success, failure, timeout and Ctrl-C.

Every call uses ``_preload_content=False`` and plain dicts, so fields newer (or older)
than the client's models never break the launcher.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness.derive_after import with_wall_time
from harness.result import BenchResult, ResultError
from harness.spec import RunSpec
from harness.transport import extract_marked, write_atomic
from pytest_llmbench.launchers.base import (
    Interrupted,
    LauncherKind,
    Progress,
    attribute_failure,
    checked_table,
    tail,
    why_stopped,
)
from pytest_llmbench.launchers.k8s import podsecurity as k8s_podsecurity
from pytest_llmbench.launchers.k8s import values as k8s_values
from pytest_llmbench.launchers.k8s.cluster import ApiError, Cluster, pod_index
from pytest_llmbench.launchers.k8s.kinds import KINDS, KindError, as_kind, pod_label
from pytest_llmbench.launchers.k8s.manifests import (
    Placement,
    PlacementError,
    object_name,
    owned_by,
    render_case,
)
from pytest_llmbench.launchers.k8s.queue import admitted
from pytest_llmbench.launchers.k8s.verdicts import (
    PodWatch,
    deadline_exceeded,
    first_failure,
    job_verdict,
    rank0,
    refused,
    suspended_again,
)
from pytest_llmbench.launchers.progress import RankProgress, last_progress_line, last_steps
from pytest_llmbench.options import Option, checked, choice, text


def cluster_config_problem(settings) -> str | None:
    """Why no cluster can be reached with these settings, or None (no client import)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None  # in-cluster config
    path = settings.k8s_kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] \
        or os.path.expanduser("~/.kube/config")
    if not os.path.isfile(path):
        return (f"no cluster configuration: kubeconfig {path!r} does not exist and this is not a pod "
                f"(set --llmbench-k8s-kubeconfig or KUBECONFIG)")
    return None


def _check(settings, profiles: dict) -> str | None:
    """A cluster to reach and every profile's placement valid with the chosen image."""
    problem = None if settings.values.get("dry_run") else cluster_config_problem(settings)
    if problem:
        return f"--llmbench-launcher=k8s ({settings.sources['launcher']}): {problem}"
    for profile in profiles.values():
        try:
            Placement.from_profile(profile.launch.get("k8s", {}), source=profile.source,
                                   image=settings.k8s_image)
        except PlacementError as exc:
            return str(exc)
    return None


class K8sLauncher:
    """Runs cases as Indexed Jobs; ``placement`` is the profile's [k8s] table (node selector,
    tolerations, GPU resources, timeouts), ``placement_source`` the file it came from."""

    def __init__(self, *, namespace: str, image: str, pull_secret: str | None = None,
                 kubeconfig: str | None = None, context: str | None = None, poll_s: float = 1.0,
                 placement: dict | None = None, placement_source: str = "profile", kind: str = "job") -> None:
        self.namespace, self.image, self.pull_secret, self.kind = namespace, image, pull_secret, kind
        self.kubeconfig, self.context, self.poll_s = kubeconfig, context, poll_s
        self.placement, self.placement_source = placement or {}, placement_source

    @classmethod
    def from_settings(cls, settings, profile=None) -> K8sLauncher:
        return cls(namespace=settings.k8s_namespace, image=settings.k8s_image,
                   pull_secret=settings.k8s_pull_secret, kubeconfig=settings.k8s_kubeconfig,
                   context=settings.k8s_context,
                   placement=profile.launch.get("k8s", {}) if profile else {},
                   placement_source=profile.source if profile else "profile", kind=settings.k8s_kind)

    def preview(self, spec: RunSpec, *, run_id: str, timeout_s: float, env: dict[str, str],
                run_dir: Path) -> dict[str, str]:
        """What ``run`` would create, as files (``--llmbench-dry-run``): the case's manifests."""
        import yaml

        where = Placement.from_profile(self.placement, source=self.placement_source, image=self.image,
                                       namespace=self.namespace, pull_secret=self.pull_secret)
        try:
            objects = self._objects(spec, run_id=run_id, placement=where, env=env, timeout_s=timeout_s)
        except KindError as exc:
            return {"CANNOT-RUN.txt": f"{self.placement_source}: {exc}\n"}
        files = {"manifests.yaml": yaml.safe_dump_all(objects, sort_keys=False)}
        pod_security = k8s_podsecurity.warning(objects)
        if pod_security:
            files["WARNING-pod-security.txt"] = pod_security + "\n"
        return files

    def _objects(self, spec: RunSpec, **render) -> list[dict]:
        """The case's objects as this launcher's kind (the owner first)."""
        if "compile" in spec.variant_parts() and not render["placement"].image_compiler:
            raise KindError(
                f"variant {spec.variant!r}: torch.compile builds its kernels with a C compiler and Python.h, "
                f"and the project's pod images carry neither (docs/GPU.md); a pod would fail at its first "
                f"compiled step. Set k8s.image_compiler = true in the profile for an image that has them")
        return as_kind(render_case(spec, **render), self.kind, spec=spec)

    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress) -> BenchResult:
        started = time.monotonic()
        where = Placement.from_profile(self.placement, source=self.placement_source, image=self.image,
                                       namespace=self.namespace, pull_secret=self.pull_secret)
        try:
            objects = self._objects(spec, run_id=run_id, placement=where, env=env, timeout_s=timeout_s)
        except KindError as exc:
            return BenchResult.failure(spec, status="error", run_id=run_id,
                                       error=f"{self.placement_source}: {exc}")
        run_dir.mkdir(parents=True, exist_ok=True)
        import yaml

        write_atomic(run_dir / "manifests.yaml", yaml.safe_dump_all(objects, sort_keys=False))
        queue_s = where.queue_timeout_s if where.queue else 0.0
        cluster = Cluster(self._api_client(), self.namespace, deadline=started + queue_s + timeout_s,
                          owner=objects[0]["kind"], pods_of=pod_label(objects[0]))
        name = object_name(run_id)
        created: list[dict] = []
        try:
            job = cluster.create(objects[0])  # the Job, suspended; it owns the rest
            created.append(objects[0])
            for obj in objects[1:]:
                cluster.create(owned_by(obj, job))
                created.append(obj)
            refused = None
            if where.queue:  # Kueue resumes it when it admits it
                refused = admitted(cluster, job, where, progress)
            else:
                cluster.resume(name)
            if refused:
                status, reason = refused
            else:
                running = time.monotonic()  # the case's timeout counts from admission, as the Job's deadline
                cluster.deadline = running + timeout_s
                watch = PodWatch(expected=spec.nnodes, schedule_timeout_s=where.schedule_timeout_s,
                                 rendezvous_timeout_s=where.rendezvous_timeout_s)
                status, reason = self._wait(cluster, name, watch, timeout_s, running, progress,
                                            world_size=spec.world_size)
            result = self._result(cluster, spec, name, run_id, run_dir, status, reason,
                                  first_failed=None if refused else watch.failed_index,
                                  lost=not refused and bool(watch.lost))
        except KeyboardInterrupt as exc:
            result = self._result(cluster, spec, name, run_id, run_dir, "error",
                                  f"{why_stopped(exc)}; pods deleted")
            raise Interrupted(with_wall_time(result, time.monotonic() - started)) from None
        except ApiError as exc:
            result = BenchResult.failure(spec, status="error", run_id=run_id,
                                         error=f"Kubernetes API: {exc}")
        finally:
            for obj in reversed(created):
                cluster.delete(obj)
        return with_wall_time(result, time.monotonic() - started)

    def _api_client(self):
        from kubernetes import client, config

        if os.environ.get("KUBERNETES_SERVICE_HOST") and not self.kubeconfig:
            config.load_incluster_config()
            return client.ApiClient()
        return config.new_client_from_config(config_file=self.kubeconfig, context=self.context)

    def _wait(self, cluster: Cluster, name: str, watch: PodWatch, timeout_s: float, started: float,
              progress: Progress, *, world_size: int) -> tuple[str, str]:
        """Poll the Job and its pods until it ends; (status, reason)."""
        last_progress = 0.0
        ranks = RankProgress()
        while True:
            job = cluster.get_job(name)
            pods = cluster.pods(name)
            rank0_log = lambda p=pods: cluster.log(rank0(p), tail_lines=50)  # noqa: E731
            evicted = lambda j=job: cluster.workload(j["metadata"]["uid"])  # noqa: E731 (read if suspended)
            verdict = suspended_again(job, evicted) or deadline_exceeded(job) or \
                watch.check(pods, time.monotonic(), rank0_log) or \
                job_verdict(job) or (refused(cluster.refused_pods(name), watch, started) if
                                     len(pods) < watch.expected else None)
            if verdict:
                return verdict
            if time.monotonic() - started > timeout_s:
                doing = ranks.summary(range(world_size), time.monotonic())
                return "timeout", f"no result after {timeout_s:g} s; {doing}; pods deleted"
            if pods and time.monotonic() - last_progress > 5:  # every pod's last steps, a few GETs
                tails = {pod_index(pod): cluster.log(pod, tail_lines=20) for pod in pods}
                for text in tails.values():
                    ranks.update(last_steps(text), time.monotonic())
                line = last_progress_line(tails[pod_index(rank0(pods))])
                if line:
                    progress(line)
                last_progress = time.monotonic()
            time.sleep(self.poll_s)

    def _result(self, cluster: Cluster, spec: RunSpec, name: str, run_id: str, run_dir: Path,
                status: str, reason: str, first_failed: int | None = None, lost: bool = False) -> BenchResult:
        logs: dict[int, str] = {}
        for pod in cluster.pods(name):
            index = pod_index(pod)
            logs[index] = cluster.log(pod)
            write_atomic(run_dir / f"pod-{index}.log", logs[index])
        log_tail = "\n".join(f"--- pod {i} ---\n{tail(t, 20)}" for i, t in sorted(logs.items()))
        order = sorted(logs, key=lambda i: (i != first_failed, i))  # the first pod to fail first
        try:
            found = [r for i in order if (r := extract_marked(logs[i]))]
        except ResultError as exc:
            return BenchResult.failure(spec, status="error", run_id=run_id, log_tail=log_tail,
                                       error=f"result in the pod log is unusable: {exc}")
        ok = [r for r in found if r.ok]
        if ok:  # a finished measurement is never thrown away
            return ok[0]
        if found:  # a rank recorded its own failure
            cause = attribute_failure(first_failure(found), "\n".join(logs.values()))
            if lost:  # a pod was lost first: the survivors' errors (a peer gone mid-collective) follow it
                return cause.replace(error=f"{reason}; then {cause.error}", log_tail=log_tail)
            return cause.replace(log_tail=log_tail)
        if status == "finished":
            status, reason = "error", "the Job completed but no pod log holds a result"
        return BenchResult.failure(spec, status=status, run_id=run_id, error=reason, log_tail=log_tail)


KIND = LauncherKind(
    name="k8s", doc="each case an Indexed Job of pods on a Kubernetes cluster (OKE and others)",
    make=K8sLauncher.from_settings, profile_table="k8s", ab_sides=("env", "image"),
    parse_table=checked_table("k8s", k8s_values.placement_problem), spans_nodes=True,
    marker=True, check=_check, owned_env=("PET_*", "PYTHONUNBUFFERED", "HOME", "LLMBENCH_NODE"), options=(
        Option("k8s-context", "kubeconfig context for --llmbench-launcher=k8s.", text),
        Option("k8s-namespace", "namespace for benchmark pods. Default: llmbench.",
               checked(k8s_values.dns_label, "namespace"), default="llmbench"),
        Option("k8s-kubeconfig", "kubeconfig file. Default: $KUBECONFIG or ~/.kube/config.", text),
        Option("k8s-image", "container image with harness/ (tag or @sha256 digest).",
               checked(k8s_values.image, "image reference"), default="ghcr.io/pytest-llmbench/harness:0.1.0"),
        Option("k8s-pull-secret", "imagePullSecret name for the image.",
               checked(k8s_values.dns_subdomain, "secret name")),
        Option("k8s-kind", "what each case is submitted as: job (an Indexed Job), jobset (a JobSet, "
               "jobset.x-k8s.io/v1alpha2) or trainjob (a Kubeflow Trainer TrainJob on the torch-distributed "
               "runtime, trainer.kubeflow.org/v1alpha1). Default: job.", choice(KINDS), default="job"),
    ))
