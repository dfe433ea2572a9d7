"""The few Kubernetes API calls the k8s launcher makes (launchers/k8s.py), on plain dicts: create and delete
a case's objects, read its Job, its pods and their logs. The ``kubernetes`` client is imported when a
Cluster is made, never at import."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

INDEX = "batch.kubernetes.io/job-completion-index"


class ApiError(RuntimeError):
    pass


class Cluster:
    """The few API calls the launcher makes, on plain dicts."""

    def __init__(self, api_client, namespace: str) -> None:
        from kubernetes import client

        self.ns = namespace
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)

    def _calls(self, kind: str) -> tuple[Callable, Callable]:
        return {"ConfigMap": (self.core.create_namespaced_config_map, self.core.delete_namespaced_config_map),
                "Service": (self.core.create_namespaced_service, self.core.delete_namespaced_service),
                "NetworkPolicy": (self.net.create_namespaced_network_policy,
                                  self.net.delete_namespaced_network_policy),
                "Job": (self.batch.create_namespaced_job, self.batch.delete_namespaced_job)}[kind]

    def create(self, obj: dict) -> None:
        self._call(self._calls(obj["kind"])[0], self.ns, obj, _preload_content=False)

    def delete(self, obj: dict) -> None:
        """Delete, pods included (foreground); a missing object is not an error."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._calls(obj["kind"])[1](obj["metadata"]["name"], self.ns, propagation_policy="Foreground",
                                        _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise ApiError(f"deleting {obj['kind']} {obj['metadata']['name']}: {exc.status} "
                               f"{exc.reason}") from None

    def get_job(self, name: str) -> dict:
        return self._read(self.batch.read_namespaced_job, name, self.ns)

    def pods(self, name: str) -> list[dict]:
        items = self._read(self.core.list_namespaced_pod, self.ns,
                           label_selector=f"llmbench.dev/run={name}")["items"]
        return sorted(items, key=pod_index)

    def log(self, pod: dict, tail_lines: int | None = None) -> str:
        from kubernetes.client.exceptions import ApiException

        kwargs = {"tail_lines": tail_lines} if tail_lines else {}
        try:
            resp = self.core.read_namespaced_pod_log(pod["metadata"]["name"], self.ns,
                                                     _preload_content=False, **kwargs)
        except ApiException:
            return ""  # not started yet, or already gone
        return resp.data.decode(errors="replace")

    def _read(self, method: Callable, *args: Any, **kwargs: Any) -> dict:
        resp = self._call(method, *args, _preload_content=False, **kwargs)
        return json.loads(resp.data)

    @staticmethod
    def _call(method: Callable, *args: Any, **kwargs: Any):
        from kubernetes.client.exceptions import ApiException

        try:
            return method(*args, **kwargs)
        except ApiException as exc:
            raise ApiError(f"{method.__name__}: {exc.status} {exc.reason}: {exc.body}") from None


def pod_index(pod: dict) -> int:
    meta = pod["metadata"]
    value = (meta.get("annotations") or {}).get(INDEX) or (meta.get("labels") or {}).get(INDEX, "0")
    return int(value)
