"""What a case's Kubernetes objects say about it (launchers/k8s/launcher.py reads them each poll): its pods
(image errors, unschedulable, failed, lost or deleted pods, a hung rendezvous), its Job (complete,
failed, its deadline, suspended again by Kueue) and the API server's refusal of its pods. Pure
functions of the objects as plain dicts: no client, no cluster."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from harness.result import BenchResult
from pytest_llmbench.launchers.k8s.cluster import pod_index

IMAGE_ERRORS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                "CreateContainerConfigError", "CreateContainerError"}
NO_OOMKILLED = ("cause unknown: the kubelet reports a container the OOM killer ended as OOMKilled, "
                "and this one was not")


class PodWatch:
    """What the pods say: image errors, unschedulable, failed or lost pods, a hung rendezvous."""

    def __init__(self, *, expected: int, schedule_timeout_s: float, rendezvous_timeout_s: float) -> None:
        self.expected = expected
        self.schedule_timeout_s, self.rendezvous_timeout_s = schedule_timeout_s, rendezvous_timeout_s
        self.seen: set[str] = set()
        self.lost: str = ""  # the first pod that disappeared
        self.failed_index: int | None = None
        self.pending_since: float | None = None
        self.running_since: float | None = None

    def check(self, pods: list[dict], now: float, rank0_log: Callable[[], str]) -> tuple[str, str] | None:
        names = {p["metadata"]["name"] for p in pods}
        lost = self.seen - names
        if lost:
            self.lost = sorted(lost)[0]
            return "error", f"pod {self.lost} disappeared (deleted, evicted or its node was lost)"
        self.seen |= names
        failed = [(_finished_at(p), pod_index(p), v) for p in pods if (v := pod_verdict(p))]
        if failed:  # the first pod to fail is the cause; the others failed because it did
            _, self.failed_index, verdict = min(failed)
            return verdict
        unscheduled = [p for p in pods if _unschedulable(p)]
        if unscheduled:
            self.pending_since = self.pending_since or now
            if now - self.pending_since > self.schedule_timeout_s:
                message = _unschedulable(unscheduled[0])
                return "error", f"pod unschedulable for {self.schedule_timeout_s:g} s: {message}"
        else:
            self.pending_since = None
        running = len(pods) == self.expected and all(p["status"].get("phase") == "Running" for p in pods)
        if running:
            self.running_since = self.running_since or now
            if now - self.running_since > self.rendezvous_timeout_s and \
                    "llmbench train step" not in rank0_log():
                return "timeout", (f"rendezvous hung: all {self.expected} pods running for "
                                   f"{self.rendezvous_timeout_s:g} s and no training step started")
        return None


def refused(note: str | None, watch: PodWatch, started: float) -> tuple[str, str] | None:
    """Pods the API server will not create: Pod Security admission refuses them for good (at once); any
    other refusal (a quota) fails the case once it has lasted the schedule timeout."""
    if not note:
        return None
    if "PodSecurity" in note or time.monotonic() - started > watch.schedule_timeout_s:
        return "error", f"the API server refused the case's pods: {note}"
    return None


def first_failure(failures: list[BenchResult]) -> BenchResult:
    """The failure that came first: its rank is the cause, the others are peers whose
    collectives broke after it. Each rank stamps its failure when it catches it (microseconds);
    pod finish times tie to the second, so they only break ties here (list order)."""
    return min(failures, key=lambda r: r.created_utc)


def suspended_again(job: dict, workload=lambda: None) -> tuple[str, str] | None:
    """A running Job suspended again: Kueue preempted or evicted it, and its pods are being deleted.
    ``workload()`` reads the Job's Kueue Workload (only then): its eviction names why, in Kueue's words
    (Preempted, Deactivated, ...)."""
    if not job.get("spec", {}).get("suspend"):
        return None
    evicted = kueue_eviction(workload())
    why = f"Kueue evicted it: {evicted}" if evicted else \
        "Kueue preempted or evicted it, or someone suspended it"
    return "error", f"the Job was suspended after it started ({why}): a case is not re-run half-way"


def kueue_eviction(workload: dict | None) -> str | None:
    """Kueue's words for an eviction of an admitted Workload, or None: its Evicted condition while it
    holds, else the last eviction Kueue counted (``status.schedulingStats.evictions``, with the Requeued
    condition's message), which stays once Kueue has queued the Workload again or re-admitted it."""
    status = (workload or {}).get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    evicted = conditions.get("Evicted") or {}
    if evicted.get("status") == "True":
        return f"{evicted.get('reason', '')}: {evicted.get('message', '')}".rstrip(": ")
    counted = [e for e in (status.get("schedulingStats") or {}).get("evictions") or [] if e.get("count")]
    if not counted:
        return None
    reason, requeued = counted[-1].get("reason", "evicted"), conditions.get("Requeued") or {}
    said = requeued.get("message", "") if requeued.get("reason") == reason else ""
    return f"{reason}: {said}".rstrip(": ")


def deadline_exceeded(job: dict) -> tuple[str, str] | None:
    """The Job's activeDeadlineSeconds ran out: the Job controller marks it (FailureTarget, then Failed)
    and deletes its pods, whose exits then are the deadline's doing, not a rank's."""
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("FailureTarget", "Failed") and cond.get("status") == "True" \
                and cond.get("reason") == "DeadlineExceeded":
            return "timeout", f"Job failed: DeadlineExceeded: {cond.get('message', '')}".strip()
    return None


def job_verdict(job: dict) -> tuple[str, str] | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond["type"] in ("Complete", "Completed"):  # a Job's and a TrainJob's; a JobSet's
            return "finished", ""
        if cond["type"] == "Failed":
            status = "timeout" if cond.get("reason") == "DeadlineExceeded" else "error"
            return status, f"Job failed: {cond.get('reason')}: {cond.get('message', '')}".strip()
    return None


def pod_verdict(pod: dict) -> tuple[str, str] | None:
    name = pod["metadata"]["name"]
    if pod["metadata"].get("deletionTimestamp") and _finished_at(pod) != "~":  # stopped from outside
        code = next((((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                     for cs in pod["status"].get("containerStatuses") or []), None)
        return "error", (f"pod {name} (node rank {pod_index(pod)}) was deleted while it ran (deleted, "
                         f"evicted, preempted or its node drained); it exited {code}")
    for cs in pod["status"].get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_ERRORS:
            return "error", f"pod {name}: {waiting['reason']}: {waiting.get('message', '')}".strip()
        done = (cs.get("state") or {}).get("terminated") or {}
        if done.get("reason") == "OOMKilled":
            return "oom", f"pod {name} was OOMKilled (container memory limit)"
        if done and done.get("exitCode", 0) != 0:
            code = done["exitCode"]
            why = {128 + signal.SIGKILL: f" (SIGKILL; {NO_OOMKILLED})",
                   128 + signal.SIGTERM: " (SIGTERM: the pod was stopped: deleted, evicted, preempted or its "
                                         "node drained)"}.get(code, "")
            return "error", f"pod {name} (node rank {pod_index(pod)}) exited {code}{why}"
    if pod["status"].get("phase") == "Failed":
        why = f"{pod['status'].get('reason', '')} {pod['status'].get('message', '')}".strip()
        return "error", f"pod {name} failed: {why or 'no reason given'}"
    return None


def _finished_at(pod: dict) -> str:
    for cs in pod["status"].get("containerStatuses") or []:
        done = (cs.get("state") or {}).get("terminated") or {}
        if done.get("finishedAt"):
            return done["finishedAt"]
    return "~"  # still running: sorts after any timestamp


def _unschedulable(pod: dict) -> str | None:
    for cond in pod["status"].get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return cond.get("message") or "Unschedulable"
    return None


def rank0(pods: list[dict]) -> dict:
    return min(pods, key=pod_index)
