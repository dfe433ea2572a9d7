"""A real two-node Slurm cluster on this host: munge, slurmctld and two slurmd with their own
node names and ports, all state in one scratch folder (Debian's slurm-wlm and munge; the recipe is
this module).

The Slurm launcher's tests run against it (tests/slurm), and so can a user who wants to try
``--llmbench-launcher=slurm`` without a cluster:

    python tools/slurm_local.py up [DIR]      start it (default DIR: .llmbench/slurm); prints the
                                              SLURM_CONF line to export
    python tools/slurm_local.py down [DIR]    stop every daemon it started, by the PIDs it recorded

Needs root and Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``). Both
"nodes" are this host, so a case "spans two nodes" over loopback: what this tests is the
scheduler's side (submission, steps, node lists, states, signals), not a network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MUNGE_PID = Path("/run/munge/munged.pid")
PARTITION = "debug"
DOWN_PARTITION = "closed"  # a partition that is down: a job there pends (reason PartitionDown)


def missing() -> str | None:
    """Why this host cannot run the cluster, or None."""
    absent = [name for name in ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol")
              if not (shutil.which(name) or Path("/usr/sbin", name).exists())]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the daemons need root (munge and slurmd run as root here)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LocalCluster:
    """Two nodes, ``n1`` and ``n2``, each with ``cpus`` CPUs, in partition ``debug``; ``env``
    points the Slurm commands at it. ``start()`` waits until both nodes are idle."""

    def __init__(self, root: Path, *, cpus: int = 2, nodes: int = 2) -> None:
        self.root = Path(root).resolve()
        self.cpus, self.names = cpus, [f"n{i + 1}" for i in range(nodes)]
        self.conf = self.root / "slurm.conf"
        self.started_munge = False

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        ctld, slurmd, *node_ports = _free_ports(2 + len(self.names))
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                          f"CPUs={self.cpus} State=UNKNOWN"
                          for name, port in zip(self.names, node_ports, strict=True))
        node_list = ",".join(self.names)
        self.conf.write_text(f"""\
ClusterName=llmbench
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root}/log/ctld.log
SlurmdLogFile={self.root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
SlurmctldPort={ctld}
SlurmdPort={slurmd}
# Seconds, not Slurm's defaults of 30 and more: the tests wait for these.
KillWait=2
MessageTimeout=5
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
{nodes}
PartitionName={PARTITION} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
PartitionName={DOWN_PARTITION} Nodes={node_list} Default=NO MaxTime=INFINITE State=DOWN
""")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30,
                              env={**os.environ, **self.env})

    def _start_munge(self) -> None:
        if MUNGE_SOCKET.exists() and subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return  # a munged is already serving this host
        MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(KeyError, OSError):
            shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
        subprocess.run([_sbin("munged"), "--force"], check=True, capture_output=True, timeout=30)
        self.started_munge = True
        (self.root / "munged.started").write_text(MUNGE_PID.read_text() if MUNGE_PID.exists() else "")

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        problem = missing()
        if problem:
            raise RuntimeError(f"cannot start a local Slurm cluster: {problem}")
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self._start_munge()
        env = {**os.environ, **self.env}
        subprocess.run([_sbin("slurmctld"), "-f", str(self.conf)], check=True, env=env, timeout=30)
        for name in self.names:
            subprocess.run([_sbin("slurmd"), "-f", str(self.conf), "-N", name], check=True, env=env,
                           timeout=30)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self._run("sinfo", "-h", "-p", PARTITION, "-N", "-o", "%N %t", check=False).stdout
            if states.count(" idle") == len(self.names):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"local Slurm cluster in {self.root} not idle after {timeout_s:g} s: "
                           f"{states.strip() or 'sinfo says nothing'}; logs in {self.root / 'log'}")

    def pids(self) -> list[int]:
        """The daemons this cluster started (munged only if it started it)."""
        files = [self.root / "slurmctld.pid", *(self.root / f"slurmd-{n}.pid" for n in self.names)]
        if (self.root / "munged.started").exists():
            files.append(MUNGE_PID)
        pids = []
        for path in files:
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text().split()[0]))
        return pids

    def stop(self, grace_s: float = 10.0) -> None:
        """Cancel every job, then stop the daemons by their PIDs (SIGTERM, then SIGKILL)."""
        with contextlib.suppress(Exception):
            self._run("scancel", "--full", "-u", "root", check=False)
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for pid in pids:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            (self.root / "munged.started").unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    cluster = LocalCluster(Path(argv[1] if len(argv) == 2 else ".llmbench/slurm"))
    if argv[0] == "up":
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
    else:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
