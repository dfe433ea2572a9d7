"""The few Kubernetes API calls the k8s launcher makes (launcher.py), on plain dicts: create and delete
a case's objects, read its Job, its pods and their logs. The ``kubernetes`` client is imported when a
Cluster is made, never at import.

A busy API server answers 429 (with Retry-After) or a 5xx, and a connection can drop: an hour-long
case must not end on one such blip. Every call is retried on 429, 500, 502, 503, 504 and connection
errors, waiting Retry-After when the server gives one, else backing off (0.5 s doubling to 10 s,
with jitter), until the case's deadline (``Cluster.deadline``, the launcher's timeout); a lasting
outage then fails the case with the API server's last words and how long it was retried. A create
retried after its first try may have reached the server: its 409 AlreadyExists is then success. The
client retries no status code itself (kubernetes/client/rest.py passes ``Configuration.retries``,
None here, to urllib3, whose default retries a failed connection only)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

INDEX = "batch.kubernetes.io/job-completion-index"
API = {"JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),  # the owners that are custom resources
       "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}
KUEUE_GROUP = "kueue.x-k8s.io"
# Kueue serves v1beta2 since 0.15 and stores it since 0.16; its 0.20 candidates stop serving v1beta1.
# v1beta1 is read only from a Kueue too old to serve v1beta2 (the first 404 says which).
KUEUE_VERSIONS = ("v1beta2", "v1beta1")


RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_S, BACKOFF_MAX_S = 0.5, 10.0
DELETE_GRACE_S = 60.0  # deletes after the case's deadline still retry this long


class ApiError(RuntimeError):
    pass


class Cluster:
    """The few API calls the launcher makes, on plain dicts."""

    def __init__(self, api_client, namespace: str, deadline: float | None = None, owner: str = "Job",
                 pods_of: str = "llmbench.dev/run") -> None:
        from kubernetes import client

        self.ns = namespace
        self.owner = owner  # the kind of the object that owns a case's others: Job, JobSet or TrainJob
        self.pods_of = pods_of  # the label key that selects its pods, its value the owner's name
        self.deadline = time.monotonic() + 300 if deadline is None else deadline  # time.monotonic()
        self.retried = 0  # calls retried, for the case's record
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.events = client.EventsV1Api(api_client)
        self.kueue_version = KUEUE_VERSIONS[0]

    def _calls(self, kind: str) -> tuple[Callable, Callable]:
        if kind in API:  # a custom resource: the same calls, its group, version and plural bound
            group, version, plural = API[kind]
            return (lambda ns, body, **kw: self.custom.create_namespaced_custom_object(
                        group, version, ns, plural, body, **kw),
                    lambda name, ns, **kw: self.custom.delete_namespaced_custom_object(
                        group, version, ns, plural, name, **kw))
        return {"ConfigMap": (self.core.create_namespaced_config_map, self.core.delete_namespaced_config_map),
                "Service": (self.core.create_namespaced_service, self.core.delete_namespaced_service),
                "NetworkPolicy": (self.net.create_namespaced_network_policy,
                                  self.net.delete_namespaced_network_policy),
                "Job": (self.batch.create_namespaced_job, self.batch.delete_namespaced_job)}[kind]

    def create(self, obj: dict) -> dict:
        """The object as the API server created it (its uid among the rest)."""
        # Strict: a field the API server does not know is an error, never dropped in silence (a CRD of
        # another version prunes what its schema lacks, and the default only warns)
        resp = self._call(self._calls(obj["kind"])[0], self.ns, obj, _preload_content=False, created=True,
                          field_validation="Strict")
        if resp is None:  # an earlier try created it (409 on the retry): read it back
            return self.get_job(obj["metadata"]["name"]) if obj["kind"] == self.owner else obj
        return json.loads(resp.data)

    def resume(self, name: str) -> None:
        """Unsuspend the owner (the one field): a JSON patch for a Job; a merge patch for a custom resource,
        which is what the client sends a custom object's patch as (application/merge-patch+json: a JSON
        patch's list is refused there, 400)."""
        patch = [{"op": "replace", "path": "/spec/suspend", "value": False}]
        if self.owner in API:
            group, version, plural = API[self.owner]
            self._call(self.custom.patch_namespaced_custom_object, group, version, self.ns, plural, name,
                       {"spec": {"suspend": False}}, _preload_content=False)
        else:
            self._call(self.batch.patch_namespaced_job, name, self.ns, patch, _preload_content=False)

    def workload(self, job_uid: str) -> dict | None:
        """Kueue's Workload for the Job (labelled with its uid, Kueue's docs: troubleshooting jobs), or
        None while Kueue has made none."""
        from kubernetes.client.exceptions import ApiException

        for version in KUEUE_VERSIONS[KUEUE_VERSIONS.index(self.kueue_version):]:
            try:
                items = self._read(self.custom.list_namespaced_custom_object, KUEUE_GROUP, version, self.ns,
                                   "workloads", label_selector=f"kueue.x-k8s.io/job-uid={job_uid}",
                                   raw=True)["items"]
            except ApiException as exc:
                if exc.status == 404 and version != KUEUE_VERSIONS[-1]:
                    self.kueue_version = KUEUE_VERSIONS[KUEUE_VERSIONS.index(version) + 1]
                    continue  # this Kueue does not serve this version (or is not installed)
                if exc.status == 404:
                    return None
                raise ApiError(f"listing Kueue workloads: {exc.status} {exc.reason}: {exc.body}") from None
            return items[0] if items else None
        return None

    def refused_pods(self, name: str) -> str | None:
        """The API server's refusal of the owner's pods, as its controller recorded it (a FailedCreate
        event on the Job: Pod Security admission, a quota), or None. Events are read at events.k8s.io/v1,
        where the message is ``note``."""
        items = self._read(self.events.list_namespaced_event, self.ns,
                           field_selector="reason=FailedCreate")["items"]
        # the owner's own Job, or a JobSet's or TrainJob's child Jobs (<name>-<replicated job>-<index>)
        regarding = [((e.get("regarding") or {}).get("name") or "", e.get("note") or "") for e in items]
        notes = [note for of, note in regarding if of == name or of.startswith(f"{name}-")]
        return notes[-1] if notes else None

    def delete(self, obj: dict) -> None:
        """Delete, pods included (foreground); a missing object is not an error."""
        from kubernetes.client.exceptions import ApiException

        self.deadline = max(self.deadline, time.monotonic() + DELETE_GRACE_S)
        try:
            self._call(self._calls(obj["kind"])[1], obj["metadata"]["name"], self.ns,
                       propagation_policy="Foreground", _preload_content=False, raw=True)
        except ApiException as exc:
            if exc.status != 404:
                raise ApiError(f"deleting {obj['kind']} {obj['metadata']['name']}: {exc.status} "
                               f"{exc.reason}") from None

    def get_job(self, name: str) -> dict:
        """The owner (Job, JobSet or TrainJob), status included."""
        if self.owner in API:
            group, version, plural = API[self.owner]
            return self._read(self.custom.get_namespaced_custom_object, group, version, self.ns, plural, name)
        return self._read(self.batch.read_namespaced_job, name, self.ns)

    def pods(self, name: str) -> list[dict]:
        items = self._read(self.core.list_namespaced_pod, self.ns,
                           label_selector=f"{self.pods_of}={name}")["items"]
        return sorted(items, key=pod_index)

    def log(self, pod: dict, tail_lines: int | None = None) -> str:
        from kubernetes.client.exceptions import ApiException

        kwargs = {"tail_lines": tail_lines} if tail_lines else {}
        try:
            resp = self._call(self.core.read_namespaced_pod_log, pod["metadata"]["name"], self.ns,
                              _preload_content=False, raw=True, **kwargs)
        except ApiException as exc:
            if exc.status in (401, 403):  # the launcher may not read logs: no result could be read
                raise ApiError(f"read_namespaced_pod_log: {exc.status} {exc.reason}: {exc.body}") from None
            return ""  # not started yet, or already gone
        return resp.data.decode(errors="replace")

    def _read(self, method: Callable, *args: Any, raw: bool = False, **kwargs: Any) -> dict:
        resp = self._call(method, *args, _preload_content=False, raw=raw, **kwargs)
        return json.loads(resp.data)

    def _call(self, method: Callable, *args: Any, created: bool = False, raw: bool = False, **kwargs: Any):
        """``method`` retried on a busy or unreachable API server until the deadline (module docstring).
        ``created``: a 409 after a retry is success. ``raw``: other API errors are raised as they are."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        first, backoff, tries = time.monotonic(), BACKOFF_S, 0
        while True:
            try:
                return method(*args, **kwargs)
            except ApiException as exc:
                if created and tries and exc.status == 409:
                    return None  # an earlier try reached the server
                said = f"{method.__name__}: {exc.status} {exc.reason}: {exc.body}"
                if exc.status not in RETRY_STATUS:
                    if raw:
                        raise
                    raise ApiError(said) from None
                wait = retry_after(exc.headers) or backoff
            except (HTTPError, OSError) as exc:
                said, wait = f"{method.__name__}: {type(exc).__name__}: {exc}", backoff
            if time.monotonic() + wait > self.deadline:
                raise ApiError(f"{said} (retried {tries} time(s) over {time.monotonic() - first:.0f} s: the "
                               f"API server stayed unavailable until the case's deadline)") from None
            tries += 1
            self.retried += 1
            time.sleep(wait * random.uniform(1.0, 1.25))
            backoff = min(2 * backoff, BACKOFF_MAX_S)


def retry_after(headers) -> float | None:
    """The seconds a Retry-After header asks for (its delay-seconds form), else None."""
    value = (headers or {}).get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def pod_index(pod: dict) -> int:
    meta = pod["metadata"]
    value = (meta.get("annotations") or {}).get(INDEX) or (meta.get("labels") or {}).get(INDEX, "0")
    return int(value)
