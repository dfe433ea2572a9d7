"""Evidence of the kernel's OOM killer: its kill counters, read before and after a case.

A rank killed with SIGKILL may have met the OOM killer, an operator, a preemption or a
watchdog; the exit status alone cannot tell. The kernel counts OOM kills in

- cgroup v2 ``memory.events`` (``oom_kill``: processes of this cgroup or below, any OOM killer),
- cgroup v1 ``memory.oom_control`` (``oom_kill``, Linux 4.13+),
- ``/proc/vmstat`` (``oom_kill``, the whole host).

A case's SIGKILL is called ``oom`` only when one of these rose while it ran, and the result
names which one; otherwise the cause is reported as unknown.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def counter_files(proc_self_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> list[Path]:
    """The OOM-kill counter files that apply to this process, most specific first."""
    if proc_self_cgroup is None:
        try:
            proc_self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_self_cgroup = ""
    files = []
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            files += [root / path / "memory.events", root / "unified" / path / "memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1
            files += [root / "memory" / path / "memory.oom_control", root / "memory" / "memory.oom_control"]
    files.append(Path("/proc/vmstat"))
    seen: list[Path] = []
    for file in files:
        if file not in seen:
            seen.append(file)
    return seen


def read_counts(files: list[Path] | None = None) -> dict[str, int]:
    """{file: oom_kill count} for every counter file that exists and can be read."""
    counts = {}
    for file in counter_files() if files is None else files:
        try:
            text = file.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                counts[str(file)] = int(value)
    return counts


def evidence(before: dict[str, int], after: dict[str, int]) -> str | None:
    """Words naming the counter that rose between the two readings, or None."""
    for file, count in after.items():
        if file in before and count > before[file]:
            return f"the OOM killer's count in {file} rose from {before[file]} to {count} during the case"
    return None


NO_EVIDENCE = ("cause unknown: the kernel's OOM killer counts its kills (cgroup memory.events, "
               "/proc/vmstat oom_kill) and no count rose during the case; an operator, a preemption "
               "or a watchdog sends SIGKILL too")
