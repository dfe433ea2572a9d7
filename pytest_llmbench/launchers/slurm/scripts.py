"""What a Slurm case runs, as text and argument lists: the sbatch line, the job script, the step's
srun line and each node's task script. Pure rendering, no Slurm command (slurm.py runs them); every
value is a separate argument or shlex-quoted (tests/unit/test_slurm_values.py checks them with
``bash -n`` and bash itself).
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.spec import RunSpec
from pytest_llmbench.launchers.procs import RUN_MARK, case_mark
from pytest_llmbench.launchers.slurm import values as slurm_values


@dataclass(frozen=True)
class Placement:
    """Where and how a case's job runs: the profile's [slurm] table, checked (slurm_values)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpu_type: str | None = None
    exclusive: bool | None = None  # None: exclusive nodes for GPU cases
    time_margin_s: float = 120.0  # Slurm's time limit = the case timeout + this, whole minutes
    queue_timeout_s: float = 900.0  # pending longer than this ends the case
    container_image: str | None = None  # pyxis: srun --container-image
    python: str | None = None  # on the nodes; default: this interpreter (or the image's python)
    requeue: bool = False  # --requeue, for partitions that preempt by requeueing; the case still ends
    sbatch_options: tuple[str, ...] = ()

    @classmethod
    def from_table(cls, table: dict[str, Any], *, source: str) -> Placement:
        problem = slurm_values.table_problem(table)
        if problem:
            key, value, rule = problem
            raise ValueError(f"profile {source}: key 'slurm.{key}': {value!r} {rule}")
        values = dict(table)
        values["sbatch_options"] = tuple(values.get("sbatch_options", ()))
        return cls(**values)

    def node_python(self) -> str:
        return self.python or ("python" if self.container_image else sys.executable)

    def time_limit_min(self, timeout_s: float) -> int:
        return max(1, math.ceil((timeout_s + self.time_margin_s) / 60))


class SlurmScripts:
    """The scripts and command lines of a case, for a placement."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def task_script(self, spec: RunSpec, run_dir: Path, run_id: str, mark: str = "") -> str:
        """One task per node: this node's torchrun agent. Task 0 (the step's first node) picks
        the rendezvous port and publishes ``host:port`` in the run folder for the others."""
        run, python = shlex.quote(str(run_dir)), shlex.quote(self.placement.node_python())
        free_port = shlex.quote("import socket; s = socket.socket(); s.bind(('', 0)); "
                                "print(s.getsockname()[1])")
        return f"""#!/bin/bash
# One node of case {run_id} (pytest-llmbench, Slurm launcher): this node's torchrun agent.
set -u
run={run}
node="${{SLURMD_NODENAME:-$(hostname)}}"
if [ ! -r "$run/spec.json" ]; then
    echo "llmbench: node $node cannot read $run/spec.json: the run folder must be on a filesystem" \\
         "every node of the case shares (--llmbench-output)" >&2
    exit 3
fi
rdzv="$run/rendezvous-$SLURM_JOB_ID.${{SLURM_STEP_ID:-0}}.${{SLURM_RESTART_COUNT:-0}}"
if [ "$SLURM_PROCID" = 0 ]; then
    port=$({python} -c {free_port}) || exit 3
    echo "$(hostname):$port" > "$rdzv.tmp" && mv "$rdzv.tmp" "$rdzv"
fi
for _ in $(seq 600); do [ -s "$rdzv" ] && break; sleep 0.1; done
if [ ! -s "$rdzv" ]; then
    echo "llmbench: node $node: no rendezvous address from the first node in 60 s" >&2
    exit 3
fi
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${{rank}}]:' PYTHONUNBUFFERED=1
export {RUN_MARK}={shlex.quote(mark or case_mark(run_id))}
exec {python} -m torch.distributed.run --nnodes={spec.nnodes} --nproc-per-node={spec.nproc_per_node} \\
    --rdzv-backend=c10d --rdzv-endpoint="$(cat "$rdzv")" \\
    --rdzv-id="$SLURM_JOB_ID-${{SLURM_STEP_ID:-0}}" \\
    --log-dir="$run/logs/$node" --tee=3 \\
    -m harness --spec="$run/spec.json" --out="$run/result.json" --run-id={shlex.quote(run_id)}
"""

    def srun_args(self, spec: RunSpec, run_dir: Path) -> list[str]:
        """The step: one task per node, every task killed when one fails, each node's output in
        its own log."""
        args = ["srun", f"--nodes={spec.nnodes}", f"--ntasks={spec.nnodes}", "--ntasks-per-node=1",
                "--kill-on-bad-exit=1", f"--output={run_dir}/node-%n.log"]
        if spec.device == "cpu":
            args.append(f"--cpus-per-task={spec.nproc_per_node * max(1, spec.threads_per_rank)}")
        else:  # the step's own GPUs: under device cgroups a step that asks for none sees none
            args.append(self.gres(spec))
        if self.placement.container_image:
            args += [f"--container-image={self.placement.container_image}",
                     f"--container-mounts={run_dir}:{run_dir}"]
        return [*args, "bash", str(run_dir / "task.sh")]

    def gres(self, spec: RunSpec) -> str:
        """The GPUs a job and its step ask for on each node: ``--gres=gpu[:type]:<ranks per node>``."""
        kind = self.placement.gpu_type
        return f"--gres=gpu:{kind + ':' if kind else ''}{spec.nproc_per_node}"

    def sbatch_args(self, spec: RunSpec, run_dir: Path, run_id: str, timeout_s: float) -> list[str]:
        p = self.placement
        args = ["sbatch", "--parsable", f"--job-name=llmbench-{run_id}"[:128], f"--nodes={spec.nnodes}",
                "--ntasks-per-node=1", f"--time={p.time_limit_min(timeout_s)}",
                "--requeue" if p.requeue else "--no-requeue",
                f"--output={run_dir}/batch-%j.log", f"--chdir={run_dir}"]
        if spec.device == "cpu":
            args.append(f"--cpus-per-task={spec.nproc_per_node * max(1, spec.threads_per_rank)}")
        else:
            args.append(self.gres(spec))
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(p, key):
                args.append(f"--{key}={getattr(p, key)}")
        if p.exclusive or (p.exclusive is None and spec.device != "cpu"):
            args.append("--exclusive")
        return [*args, *p.sbatch_options, str(run_dir / "job.sh")]

    def preview(self, spec: RunSpec, *, run_id: str, timeout_s: float, env: dict[str, str],
                run_dir: Path) -> dict[str, str]:
        """What batch mode would submit (``--llmbench-dry-run``): the job and task scripts and the
        sbatch command."""
        return {"job.sh": self.job_script(spec, run_dir, run_id, timeout_s),
                "task.sh": self.task_script(spec, run_dir, run_id),
                "sbatch.txt": shlex.join(self.sbatch_args(spec, run_dir, run_id, timeout_s)) + "\n"}

    def job_script(self, spec: RunSpec, run_dir: Path, run_id: str, timeout_s: float) -> str:
        """The batch script, its sbatch options as ``#SBATCH`` lines: ``sbatch job.sh`` alone submits
        the case as the launcher does (which passes the same options on the command line too)."""
        step = " ".join(shlex.quote(a) for a in self.srun_args(spec, run_dir))
        options = [a for a in self.sbatch_args(spec, run_dir, run_id, timeout_s)[1:-1] if a != "--parsable"]
        lines = "".join(f"#SBATCH {shlex.quote(a)}\n" for a in options)
        return f"""#!/bin/bash
{lines}# Case {run_id}, submitted by pytest-llmbench's Slurm launcher (batch mode): one step, one
# torchrun agent per node (task.sh).
exec {step}
"""
