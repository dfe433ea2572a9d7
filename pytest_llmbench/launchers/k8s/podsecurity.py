"""Which Pod Security Standards level a case's pods meet, read from the rendered pod template (no
cluster): what ``--llmbench-dry-run`` warns about before a namespace that enforces ``baseline`` or
``restricted`` refuses the pods (the API server's PodSecurity admission, whose words the launcher then
records as the case's reason: launchers/k8s/launcher.py ``refused``).

The checks are those of the Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-
standards, as k8s.io/pod-security-admission/policy implements them) that this project's pods can meet:
host namespaces, privileged containers, added capabilities and hostPath volumes (baseline); running
as root, privilege escalation, capabilities not dropped, the seccomp profile and volume types
(restricted). tests/k8s holds the verdict to the real API server's.
"""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec a Job, JobSet or TrainJob object makes, or None for other objects."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Job":
        return spec["template"]["spec"]
    if obj.get("kind") == "JobSet":
        return spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if obj.get("kind") == "TrainJob":
        for patch in spec.get("runtimePatches") or []:
            jobs = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec", {})
            for job in jobs.get("replicatedJobs") or []:
                return job["template"]["spec"]["template"]["spec"]
    return None


def violations(pod: dict[str, Any]) -> dict[str, list[str]]:
    """``{"baseline": [...], "restricted": [...]}``: what each level refuses in this pod spec (restricted
    includes baseline's)."""
    baseline: list[str] = []
    restricted: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            baseline.append(f"host namespaces ({key}=true)")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            baseline.append(f"hostPath volume {volume['name']!r}")
        elif not kinds <= RESTRICTED_VOLUMES:
            restricted.append(f"volume {volume['name']!r} of type {', '.join(sorted(kinds))}")
    pod_ctx = pod.get("securityContext") or {}
    for container in pod.get("containers") or []:
        name = container.get("name", "?")
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            baseline.append(f"privileged (container {name!r})")
        added = set((ctx.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            baseline.append(f"capabilities {sorted(added - BASELINE_CAPABILITIES)} (container {name!r})")
        if ctx.get("allowPrivilegeEscalation") is not False:
            restricted.append(f"allowPrivilegeEscalation != false (container {name!r})")
        if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
            restricted.append(f"capabilities not dropped: ALL (container {name!r})")
        if added - {"NET_BIND_SERVICE"}:
            restricted.append(f"capabilities added beyond NET_BIND_SERVICE (container {name!r})")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            restricted.append(f"runAsNonRoot != true (container {name!r})")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            restricted.append(f"runAsUser=0 (container {name!r})")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            restricted.append(f"seccompProfile not RuntimeDefault or Localhost (container {name!r})")
    return {"baseline": baseline, "restricted": baseline + restricted}


def warning(objects: list[dict[str, Any]]) -> str | None:
    """A dry run's warning when the case's pods need more than ``restricted``, or None."""
    pod = next((p for o in objects if (p := pod_template(o)) is not None), None)
    if pod is None:
        return None
    found = violations(pod)
    if not found["restricted"]:
        return None
    if found["baseline"]:
        level, refusing, why = "privileged", "'baseline' or 'restricted'", found["baseline"]
    else:
        level, refusing, why = "baseline", "'restricted'", found["restricted"]
    return (f"these pods need Pod Security level {level!r} ({'; '.join(why)}): a namespace whose "
            f"pod-security.kubernetes.io/enforce label is {refusing} refuses them")
