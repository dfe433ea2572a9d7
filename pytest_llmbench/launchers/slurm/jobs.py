"""What the Slurm launcher asks of Slurm and reads of a job (launcher.py runs the case): whether
this host can drive Slurm, a job's fields and whether it has left the queue, cancelling it, and the
node and rank logs a job writes into its run folder, with the evidence that it could not write them.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

from pytest_llmbench.launchers.base import read_log

COMMANDS = ("sbatch", "srun", "scontrol", "squeue", "scancel")
GONE_TIMEOUT_S = 60.0  # how long a cancelled job may take to leave squeue
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:", re.MULTILINE)


def commands_problem() -> str | None:
    """Why this host cannot drive Slurm, or None: the commands and a controller that answers."""
    absent = [c for c in COMMANDS if shutil.which(c) is None]
    if absent:
        return f"{', '.join(absent)} not found on PATH (run pytest on a Slurm login node or in a job)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if ping.returncode != 0 or "is UP" not in ping.stdout:
        return f"the Slurm controller does not answer (scontrol ping: {(ping.stdout + ping.stderr).strip()})"
    return None


def mode() -> str:
    """``step`` inside an allocation (SLURM_JOB_ID set), ``batch`` outside one."""
    return "step" if os.environ.get("SLURM_JOB_ID") else "batch"


def job_info(job: str) -> dict[str, str]:
    """``scontrol show job -o``'s fields of a job (or ``JOBID.STEP`` step); {} once Slurm forgot it
    (or when scontrol could not ask: ``job_query`` says which)."""
    return job_query(job)[0]


def job_query(job: str) -> tuple[dict[str, str], str]:
    """(``job_info``'s fields, "" ) or ({}, what scontrol said when it failed): "Invalid job id" once
    Slurm forgot the job, "Unable to contact slurm controller" while slurmctld is down."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job.split(".")[0]], capture_output=True,
                             text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {}, "scontrol did not answer in 30 s"
    if out.returncode != 0:
        return {}, (out.stderr or out.stdout).strip() or f"scontrol exited {out.returncode}"
    fields = {}
    for token in out.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields, ""


def scancel(job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True, timeout=30)


def wait_gone(job: str, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    """Until the job (or step) has left squeue's active states: its processes have ended."""
    deadline = time.monotonic() + timeout_s
    step = "." in job
    while time.monotonic() < deadline:
        args = ["squeue", "-h", "-s", "-j", job.split(".")[0]] if step else ["squeue", "-h", "-j", job]
        out = subprocess.run([*args, "-o", "%i %T"], capture_output=True, text=True, timeout=30)
        rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode != 0 or not any(row[0] == job for row in rows):
            return True
        time.sleep(0.5)
    return False


def denied(run_dir: Path) -> str | None:
    """What shows that the job could not write its run folder for want of permission, or None: this
    user cannot write it, or Slurm's own batch log says "Permission denied"."""
    try:
        mode = stat.filemode(run_dir.stat().st_mode)
    except OSError as exc:
        return f"the run folder cannot be read here ({exc.strerror})"
    if not os.access(run_dir, os.W_OK | os.X_OK):
        return f"permission denied: the run folder is {mode}, not writable by uid {os.getuid()}"
    said = [line for path in run_dir.glob("batch-*.log") for line in read_log(path).splitlines()
            if "Permission denied" in line]
    return f"permission denied, Slurm says: {said[0].strip()}" if said else None


def node_logs(run_dir: Path) -> dict[str, str]:
    """{node index in the job: its agent's output} (run_dir/node-<n>.log)."""
    return {p.name[len("node-"):-len(".log")]: read_log(p) for p in sorted(run_dir.glob("node-*.log"))}


def rank_logs(run_dir: Path) -> dict[int, str]:
    """{global rank: its lines}, from the ``[rank<N>]:`` prefixes of the node logs."""
    out: dict[int, list[str]] = {}
    for text in node_logs(run_dir).values():
        for line in text.splitlines():
            found = RANK_PREFIX.match(line)
            if found:
                out.setdefault(int(found[1]), []).append(line[found.end():])
    return {rank: "\n".join(lines) + "\n" for rank, lines in sorted(out.items())}


def step_of(run_dir: Path) -> str:
    """``JOBID.STEPID`` of the case's running step, once its first task has started."""
    for path in run_dir.glob("rendezvous-*"):
        parts = path.name[len("rendezvous-"):].split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() and not path.name.endswith(".tmp"):
            return f"{parts[0]}.{parts[1]}"
    return ""
