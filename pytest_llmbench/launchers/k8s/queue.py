"""Kueue, as the k8s launcher meets it (launcher.py): a Job labelled ``kueue.x-k8s.io/queue-name``
is created suspended and Kueue resumes it when its Workload is admitted to the LocalQueue's
ClusterQueue. While it waits, the reason is Kueue's own, read from the Workload Kueue made for the Job
(labelled ``kueue.x-k8s.io/job-uid``; Kueue's docs, tasks/troubleshooting/troubleshooting_jobs):
the QuotaReserved condition's message ("couldn't assign flavors to pod set main: insufficient quota
..."), or the admission checks still pending. An eviction ends the wait (``admitted``)."""

from __future__ import annotations

import time

from pytest_llmbench.launchers.base import Progress
from pytest_llmbench.launchers.k8s.cluster import Cluster
from pytest_llmbench.launchers.k8s.manifests import Placement
from pytest_llmbench.launchers.k8s.verdicts import kueue_eviction


def admitted(cluster: Cluster, job: dict, where: Placement, progress: Progress) -> tuple[str, str] | None:
    """Wait for Kueue to admit the queued Job (it unsuspends it): None once it has, else (status, why)
    when ``queue_timeout_s`` ran out, with the reason Kueue gives on the Job's Workload. A Workload that
    Kueue admitted and evicted while this waited between two looks (its pods may have started: on a
    real node they run within a second) ends the case as an error, as an eviction seen mid-run does
    (verdicts.py ``suspended_again``), and is not waited for again."""
    name, since, said = job["metadata"]["name"], time.monotonic(), None
    uid = job["metadata"]["uid"]
    while True:
        running = cluster.get_job(name)["spec"].get("suspend") is False
        workload = cluster.workload(uid)
        evicted = kueue_eviction(workload)
        if evicted:
            again = "admitted it again" if running else "queued it again"
            return "error", (f"Kueue evicted the Job's Workload ({evicted}) and {again}: the Job may have "
                             f"started, and a case is not re-run half-way; Job deleted")
        if running:
            return None
        reason = queue_reason(workload, where.queue)
        if reason != said:
            progress(f"queued in Kueue LocalQueue {where.queue}: {reason}")
            said = reason
        if time.monotonic() - since > where.queue_timeout_s:
            waited = time.monotonic() - since
            return "timeout", (f"not admitted: queued in Kueue LocalQueue {where.queue} for {waited:.0f} s "
                               f"(queue_timeout_s {where.queue_timeout_s:g}); Kueue's reason: {reason}; "
                               f"Job deleted")
        time.sleep(min(2.0, max(0.2, where.queue_timeout_s / 100)))


def queue_reason(workload: dict | None, queue: str) -> str:
    """Why Kueue has not admitted a Workload, in Kueue's words (its QuotaReserved or Admitted condition)."""
    if workload is None:
        return (f"no Workload yet (is Kueue installed, and does it manage this namespace and the "
                f"{queue!r} LocalQueue?)")
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind in ("QuotaReserved", "Admitted"):  # an eviction ends the wait before this is asked
        cond = conditions.get(kind)
        if cond and cond.get("status") != "True":
            return f"{cond.get('reason', kind)}: {cond.get('message', '')}".strip(": ")
    checks = [c for c in (workload.get("status") or {}).get("admissionChecks") or []
              if c.get("state") != "Ready"]
    if checks:
        return "admission checks pending: " + ", ".join(f"{c.get('name')} ({c.get('state')})" for c in checks)
    return "not yet attempted by Kueue (no condition on its Workload)"
