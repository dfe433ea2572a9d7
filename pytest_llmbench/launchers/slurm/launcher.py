"""Slurm launcher: one case = one batch job (``sbatch``) or, inside an allocation, one job step
(``srun``). Per node one torchrun agent; the agents meet in a c10d rendezvous on the first node
of the step, at a port that node picks free, with the job and step as the rendezvous id.

Two modes, chosen by where pytest runs:

    batch   outside an allocation: ``sbatch`` of run_dir/job.sh, which runs the step; the job
            waits in the queue like any other (the profile's [slurm] table: partition, account,
            qos, constraint, GPUs per node, exclusive nodes, pyxis image, extra options)
    step    inside one (``SLURM_JOB_ID`` set, e.g. under ``salloc -N 4``): ``srun`` of the step in
            that allocation, so a whole matrix shares one queue wait

The run folder must be on a filesystem every node of the case sees: the nodes read spec.json
from it and write into it

    run_dir/spec.json, task.sh (and job.sh in batch mode)   what ran, as it ran
    run_dir/result.json                     written by rank 0 (or the first rank that failed)
    run_dir/node-<n>.log                    each node's agent, every line of its ranks prefixed
                                            ``[rank<N>]:`` (the result markers among them)
    run_dir/logs/<node>/.../<local rank>/   each rank's stdout and stderr (torchrun --log-dir)
    run_dir/batch-<job>.log                 the batch script's own output (batch mode)

A task that cannot see the run folder says so and exits; the result then says the folder is not
shared. The result is read from result.json, else from the checksummed markers in the node logs
(as the Kubernetes launcher reads pod logs). A rank that fails, a node that goes down, the job
killed at its time limit, a job that pends past ``queue_timeout_s``, a requeue or preemption and
Ctrl-C each end as a result with its status and Slurm's own words; the job or step is cancelled
and waited for on every path, so nothing of a case is left in ``squeue``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path

from harness.derive_after import with_wall_time
from harness.result import BenchResult
from harness.spec import RunSpec
from harness.transport import write_atomic
from pytest_llmbench.launchers import procs
from pytest_llmbench.launchers.base import (
    Interrupted,
    LauncherKind,
    Progress,
    checked_table,
    host_env,
    read_log,
    tail,
    why_stopped,
)
from pytest_llmbench.launchers.procs import RUN_MARK
from pytest_llmbench.launchers.slurm import values as slurm_values
from pytest_llmbench.launchers.slurm.jobs import (
    GONE_TIMEOUT_S,
    commands_problem,
    job_info,
    job_query,
    mode,
    scancel,
    step_of,
    wait_gone,
)
from pytest_llmbench.launchers.slurm.logs import Watch, collect
from pytest_llmbench.launchers.slurm.scripts import Placement, SlurmScripts

POLL_S = 1.0
# scontrol's words for a job Slurm has forgotten (any other failure: the controller did not answer)
FORGOTTEN = "Invalid job id"
CONTROLLER_GRACE_S = 30.0  # silent this long, the controller fails the case (a restart takes seconds)
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
ACTIVE = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"}
# Slurm's end states, in words, with the status they record
ENDED = {
    "COMPLETED": ("finished", ""),
    "FAILED": ("error", "failed"),
    "TIMEOUT": ("timeout", "was killed by Slurm at its time limit"),
    "CANCELLED": ("error", "was cancelled outside the launcher (scancel by a user or an admin)"),
    "NODE_FAIL": ("error", "lost a node (NODE_FAIL)"),
    "PREEMPTED": ("error", "was preempted"),
    "BOOT_FAIL": ("error", "could not boot its nodes (BOOT_FAIL)"),
    "DEADLINE": ("error", "passed its deadline (DEADLINE)"),
    "OUT_OF_MEMORY": ("oom", "was killed by Slurm's memory limit (OUT_OF_MEMORY)"),
    "SPECIAL_EXIT": ("error", "ended in SPECIAL_EXIT"),
}


class SlurmError(RuntimeError):
    """A Slurm command failed (sbatch rejected the job, the controller is unreachable)."""


def _check(settings, profiles: dict) -> str | None:
    problem = None if settings.values.get("dry_run") else commands_problem()
    if problem:
        return f"--llmbench-launcher=slurm ({settings.sources['launcher']}): {problem}"
    return None


class SlurmLauncher(SlurmScripts):
    """Runs cases as Slurm batch jobs or job steps (module docstring); what each job runs is
    rendered by SlurmScripts (slurm_scripts.py)."""

    def __init__(self, placement: Placement | None = None, *, poll_s: float = POLL_S) -> None:
        super().__init__(placement or Placement())
        self.poll_s = poll_s

    @classmethod
    def from_settings(cls, settings, profile=None) -> SlurmLauncher:
        table = profile.launch.get("slurm", {}) if profile else {}
        return cls(Placement.from_table(table, source=profile.source if profile else "profile"))

    # -- running --------------------------------------------------------------------------------

    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress) -> BenchResult:
        started = time.monotonic()
        run_dir = run_dir.resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "spec.json", spec.dumps())
        mark = procs.case_mark(run_id)  # this launch's processes on every node, and no other's
        write_atomic(run_dir / "task.sh", self.task_script(spec, run_dir, run_id, mark))
        how = mode()
        case_env = {**host_env(env), RUN_MARK: mark}
        watch = Watch(run_dir, spec.world_size, progress)
        job = ""
        try:
            if how == "batch":
                write_atomic(run_dir / "job.sh", self.job_script(spec, run_dir, run_id, timeout_s))
                job = self._submit(spec, run_dir, run_id, timeout_s, case_env)
                progress(f"batch mode: submitted job {job} ({spec.nnodes} node(s), time limit "
                         f"{self.placement.time_limit_min(timeout_s)} min)")
                status, reason = self._wait_job(job, watch, timeout_s)
            else:
                progress(f"step mode: a step of allocation {os.environ['SLURM_JOB_ID']} "
                         f"({spec.nnodes} node(s))")
                status, reason, job = self._run_step(spec, run_dir, case_env, watch, timeout_s)
        except KeyboardInterrupt as exc:
            job = job or step_of(run_dir)
            self._end(job, progress, mark)
            result = collect(spec, run_dir, run_id, "error", f"{why_stopped(exc)}; job {job} cancelled",
                                   how, job)
            raise Interrupted(with_wall_time(result, time.monotonic() - started)) from None
        except SlurmError as exc:
            self._end(job, progress, mark)
            return with_wall_time(BenchResult.failure(spec, status="error", run_id=run_id, error=str(exc)),
                                  time.monotonic() - started)
        self._end(job, progress, mark)
        result = collect(spec, run_dir, run_id, status, reason, how, job)
        return with_wall_time(result, time.monotonic() - started)

    def _submit(self, spec: RunSpec, run_dir: Path, run_id: str, timeout_s: float, env: dict) -> str:
        args = self.sbatch_args(spec, run_dir, run_id, timeout_s)
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
        if out.returncode != 0:
            raise SlurmError(f"sbatch rejected the job: {(out.stderr or out.stdout).strip()} "
                             f"(command: {shlex.join(args)})")
        return out.stdout.strip().split(";")[0]

    def _wait_job(self, job: str, watch: Watch, timeout_s: float) -> tuple[str, str]:
        """Poll the job until it ends; (status, reason) in Slurm's words."""
        submitted, running_since, last, unanswered = time.monotonic(), None, {}, None
        while True:
            info, said = job_query(job)
            now = time.monotonic()
            if not info and FORGOTTEN not in said:  # the controller did not answer: wait a while for it
                unanswered = unanswered or now
                if now - unanswered <= CONTROLLER_GRACE_S:
                    time.sleep(self.poll_s)
                    continue
                seen = last.get("JobState", "submitted").lower()
                return "error", (f"the Slurm controller did not answer for {now - unanswered:.0f} s while "
                                 f"job {job} was {seen} (scontrol: {said}); the job's state is unknown")
            if not info:
                seen = last.get("JobState", "never")
                return "error", f"Slurm no longer knows job {job} (last seen {seen}; scontrol: {said})"
            unanswered, last, state = None, info, info.get("JobState", "")
            if running_since is not None and (state in PENDING or info.get("Restarts", "0") != "0"):
                scancel(job)
                return "error", (f"job {job} was requeued by Slurm after it had started (state {state}, "
                                 f"reason {info.get('Reason')}); a case is not re-run half-way: cancelled")
            if state in PENDING:
                if now - submitted > self.placement.queue_timeout_s:
                    scancel(job)
                    return "timeout", (f"job {job} never started: pending for {now - submitted:.0f} s "
                                       f"(queue_timeout_s {self.placement.queue_timeout_s:g}), Slurm's "
                                       f"reason: {info.get('Reason')}; cancelled")
            elif state in ACTIVE:
                running_since = running_since or now
                if now - running_since > timeout_s:
                    doing = watch.summary()
                    scancel(job)
                    return "timeout", (f"no result after {timeout_s:g} s running; {doing}; job {job} "
                                       f"cancelled")
                watch.poll()
            else:
                status, words = ENDED.get(state, ("error", f"ended in state {state}"))
                if status == "finished":
                    return status, ""
                return status, (f"job {job} {words} (exit code {info.get('ExitCode')}, reason "
                                f"{info.get('Reason')}, nodes {info.get('NodeList')}, time limit "
                                f"{info.get('TimeLimit')})")
            time.sleep(self.poll_s)

    def _run_step(self, spec: RunSpec, run_dir: Path, env: dict, watch: Watch,
                  timeout_s: float) -> tuple[str, str, str]:
        """srun in the allocation; (status, reason, the step's JOBID.STEPID)."""
        allocation = os.environ["SLURM_JOB_ID"]
        with open(run_dir / "srun.log", "w") as log:
            proc = subprocess.Popen(self.srun_args(spec, run_dir), stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        started, running_since = time.monotonic(), None
        try:
            while True:
                try:
                    proc.wait(timeout=self.poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now, step = time.monotonic(), step_of(run_dir)
                if step:
                    running_since = running_since or now
                    watch.poll()
                    if now - running_since > timeout_s:
                        doing = watch.summary()
                        self._stop_step(proc, step)
                        return "timeout", (f"no result after {timeout_s:g} s running; {doing}; step {step} "
                                           f"cancelled"), step
                elif now - started > self.placement.queue_timeout_s:
                    self._stop_step(proc, "")
                    return "timeout", (f"the step never started in allocation {allocation}: waiting "
                                       f"{now - started:.0f} s (queue_timeout_s); srun said: "
                                       f"{tail(read_log(run_dir / 'srun.log'), 3).strip() or 'nothing'}"), ""
        except KeyboardInterrupt:
            self._stop_step(proc, step_of(run_dir))
            raise
        step = step_of(run_dir)
        if proc.returncode == 0:
            return "finished", "", step
        info = job_info(allocation)
        state = info.get("JobState", "gone")
        return "error", (f"step {step or 'of ' + allocation} failed: srun exited {proc.returncode} "
                         f"(allocation {allocation} is {state}, reason {info.get('Reason')}); srun said: "
                         f"{tail(read_log(run_dir / 'srun.log'), 5).strip() or 'nothing'}"), step

    @staticmethod
    def _stop_step(proc: subprocess.Popen, step: str) -> None:
        if step:
            scancel(step)
        for sig_wait in (10.0, 5.0):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15 if sig_wait == 10.0 else 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=sig_wait)

    def _end(self, job: str, progress: Progress, mark: str) -> None:
        """Cancel the job or step if it still runs and wait until Slurm has ended it; then no
        process of the case may be left on this host (a node of the test cluster, or a login
        node that is also a compute node)."""
        if job:
            info = job_info(job)
            if "." not in job and info.get("JobState") in PENDING | ACTIVE:
                scancel(job)
            if not wait_gone(job):
                progress(f"job {job} still in squeue {GONE_TIMEOUT_S:g} s after it was cancelled")
        leftovers = procs.end_all(RUN_MARK, mark)
        if leftovers:
            progress(f"killed {len(leftovers)} process(es) of this case that Slurm left running: "
                     f"{'; '.join(procs.describe(p) for p in leftovers)}")


KIND = LauncherKind(
    name="slurm", doc="each case a Slurm batch job, or a job step inside an allocation (salloc)",
    make=SlurmLauncher.from_settings, profile_table="slurm",
    parse_table=checked_table("slurm", slurm_values.table_problem), spans_nodes=True,
    marker=True, check=_check, owned_env=("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "SLURM_*"))
