"""The [slurm] table's rules, the scripts and the sbatch line the launcher builds from them
(no cluster: tests/slurm runs them on a real one)."""

import subprocess
from pathlib import Path

import pytest

from harness.spec import RunSpec
from pytest_llmbench.launchers.slurm import values as slurm_values
from pytest_llmbench.launchers.slurm.jobs import rank_logs
from pytest_llmbench.launchers.slurm.launcher import Placement, SlurmLauncher
from pytest_llmbench.profiles import ProfileError, load_profile

GOOD = {"partition": "gpu-a100", "account": "proj_42", "qos": "normal", "constraint": "a100&ib",
        "gpu_type": "a100", "exclusive": True, "requeue": False, "time_margin_s": 60, "queue_timeout_s": 600,
        "container_image": "nvcr.io#nvidia/pytorch:24.05-py3", "python": "/opt/venv/bin/python",
        "sbatch_options": ["--mail-type=END", "--reservation=bench"]}

BAD = [("partition", "gpu; rm -rf /", "Slurm name"), ("account", "", "Slurm name"),
       ("qos", 3, "Slurm name"), ("constraint", "a100 && ib", "feature expression"),
       ("exclusive", "yes", "true or false"), ("time_margin_s", -1, ">= 0"),
       ("queue_timeout_s", True, "number of seconds"), ("container_image", "$(id)", "pyxis image"),
       ("python", "python; id", "path or name"), ("sbatch_options", "--mail-type=END", "a list"),
       ("sbatch_options", ["--comment=a b"], "one long option"),
       ("sbatch_options", ["-p x"], "one long option"),
       ("sbatch_options", ["--comment=`id`"], "shell characters"),
       ("sbatch_options", ["--time=10"], "sets --time itself"), ("nodes", 2, "not a key of [slurm]")]


def test_every_good_value_passes():
    assert slurm_values.table_problem(GOOD) is None
    placement = Placement.from_table(GOOD, source="p.toml")
    assert placement.sbatch_options == ("--mail-type=END", "--reservation=bench")


@pytest.mark.parametrize("key, value, rule", BAD)
def test_a_bad_value_names_its_key_and_rule(key, value, rule):
    found = slurm_values.table_problem({**GOOD, key: value})
    assert found is not None and found[0] == key and rule in found[2]
    with pytest.raises(ValueError, match=f"profile p.toml: key 'slurm.{key}'"):
        Placement.from_table({key: value}, source="p.toml")


def test_a_profile_file_with_a_bad_slurm_value_is_refused_with_file_and_key(tmp_path):
    path = tmp_path / "mine.toml"
    text = (Path(__file__).parents[1] / "data" / "tinycpu.toml").read_text()
    path.write_text(text + '\n[slurm]\npartition = "gpu partition"\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert "mine.toml" in str(info.value) and "slurm.partition" in str(info.value)


def gpu_spec(**changes) -> RunSpec:
    return RunSpec.from_preset("tiny", **{"world_size": 16, "nnodes": 2, "device": "cuda", "dtype": "bf16",
                                          **changes})


def test_sbatch_line_of_a_gpu_case(tmp_path):
    launcher = SlurmLauncher(Placement.from_table(GOOD, source="p.toml"))
    args = launcher.sbatch_args(gpu_spec(), tmp_path, "h100-ddp-ws16", timeout_s=1800)
    assert args[0] == "sbatch" and args[-1] == str(tmp_path / "job.sh")
    for expected in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:a100:8", "--partition=gpu-a100",
                     "--account=proj_42", "--qos=normal", "--constraint=a100&ib", "--exclusive",
                     "--no-requeue", "--time=31", "--mail-type=END", "--reservation=bench"):
        assert expected in args, expected
    assert not any(a.startswith("--cpus-per-task") for a in args)


def test_a_gpu_step_asks_for_its_gpus_in_batch_and_step_mode(tmp_path):
    """Inside an allocation with device cgroups (step mode: `salloc -N 2 --gres=gpu:8`), a step
    that asks for no GPUs sees none; the step asks for the node's ranks' worth (37c90cc: none)."""
    launcher = SlurmLauncher(Placement.from_table(GOOD, source="p.toml"))
    step = launcher.srun_args(gpu_spec(), tmp_path)
    assert "--gres=gpu:a100:8" in step and not any(a.startswith("--cpus-per-task") for a in step)
    cpu = SlurmLauncher().srun_args(RunSpec.from_preset("tiny", world_size=2, nnodes=2), tmp_path)
    assert not any(a.startswith("--gres") for a in cpu)


def test_sbatch_line_of_a_cpu_case_asks_for_its_cores_and_shares_nodes(tmp_path):
    spec = RunSpec.from_preset("tiny", world_size=4, nnodes=1, threads_per_rank=2)
    args = SlurmLauncher().sbatch_args(spec, tmp_path, "cpu-ddp-ws4", timeout_s=300)
    assert "--cpus-per-task=8" in args and "--nodes=1" in args and "--time=7" in args
    assert "--exclusive" not in args and not any(a.startswith("--gres") for a in args)


def test_the_scripts_quote_what_they_hold_and_parse(tmp_path):
    """A run folder with a space, a quote and a dollar stays one word in both scripts."""
    run = tmp_path / "it's a $HOME run"
    launcher = SlurmLauncher(Placement(container_image="nvcr.io#nvidia/pytorch:24.05-py3"))
    spec = RunSpec.from_preset("tiny", world_size=2, nnodes=2)
    task = launcher.task_script(spec, run, "case-1")
    job = launcher.job_script(spec, run, "case-1", 600)
    for script in (task, job):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "run='" in task and "--nnodes=2 --nproc-per-node=1" in task
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in job
    assert "exec python -m torch.distributed.run" in task  # the image's python
    # what bash makes of the quoted folder: the folder itself
    echoed = subprocess.run(["bash", "-c", task.split("\n")[3] + '\nprintf %s "$run"'], capture_output=True,
                            text=True)
    assert echoed.stdout == str(run)


def test_rank_logs_split_the_node_logs_by_global_rank(tmp_path):
    (tmp_path / "node-0.log").write_text("[rank0]:step 1\n[rank1]:step 1\nagent line\n[rank0]:step 2\n")
    (tmp_path / "node-1.log").write_text("[rank2]:hello\n")
    assert rank_logs(tmp_path) == {0: "step 1\nstep 2\n", 1: "step 1\n", 2: "hello\n"}


def test_a_controller_that_does_not_answer_is_named_not_a_vanished_job(monkeypatch, tmp_path):
    """scontrol's own words decide: "Invalid job id" is a job Slurm forgot; anything else (slurmctld
    stopped: "Unable to contact slurm controller") is a controller that does not answer, which the
    launcher waits out for CONTROLLER_GRACE_S before it fails the case saying so (37c90cc: "job
    vanished from Slurm" either way, at once)."""
    import subprocess
    from types import SimpleNamespace

    from pytest_llmbench.launchers.slurm import launcher as slurm

    said = {"text": "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"}
    asked = []

    def scontrol(args, **kwargs):
        asked.append(args)
        return subprocess.CompletedProcess(args, 1, "", said["text"])

    monkeypatch.setattr(slurm.subprocess, "run", scontrol)
    monkeypatch.setattr(slurm, "CONTROLLER_GRACE_S", 0.05)
    launcher = SlurmLauncher(poll_s=0.01)
    watch = SimpleNamespace(poll=lambda: None, summary=lambda: "")
    status, reason = launcher._wait_job("42", watch, timeout_s=60)
    assert status == "error" and reason.startswith("the Slurm controller did not answer for ")
    assert "Unable to contact slurm controller" in reason and len(asked) > 1  # it waited, asking again
    said["text"] = "slurm_load_jobs error: Invalid job id specified"
    status, reason = launcher._wait_job("42", watch, timeout_s=60)
    assert reason.startswith("Slurm no longer knows job 42 (last seen never; scontrol: slurm_load_jobs")


def test_a_run_folder_the_job_cannot_write_is_called_a_permission_problem(tmp_path):
    from pytest_llmbench.launchers.slurm import jobs as slurm_jobs

    (tmp_path / "batch-7.log").write_text("slurmstepd: error: Could not open stdout file "
                                          "/x/node-n1.log: Permission denied\n")
    assert "Permission denied" in slurm_jobs.denied(tmp_path) and "Slurm says" in slurm_jobs.denied(tmp_path)
    (tmp_path / "batch-7.log").unlink()
    assert slurm_jobs.denied(tmp_path) is None  # then the shared-filesystem question stands


def test_each_slurm_launch_marks_its_processes_with_a_token_of_its_own(tmp_path):
    """Two launches that share a run id (two direct callers choosing one) must not end each other's
    processes: the task script exports the run id and a token of that launch (launchers/procs.py
    case_mark), as the local launcher's processes carry, and the clean-up looks for that mark only."""
    from pytest_llmbench.launchers.procs import RUN_MARK, case_mark

    launcher = SlurmLauncher(Placement())
    spec = RunSpec.from_preset("tiny", world_size=2, nnodes=2)
    first, second = case_mark("case-1"), case_mark("case-1")
    assert first != second and first.startswith("case-1.") and second.startswith("case-1.")
    exports = [line for line in launcher.task_script(spec, tmp_path, "case-1", first).splitlines()
               if line.startswith(f"export {RUN_MARK}=")]
    assert exports == [f"export {RUN_MARK}={first}"]
    # a script rendered without a launch (a dry-run preview) still carries a mark of its own
    previewed = [line for line in launcher.task_script(spec, tmp_path, "case-1").splitlines()
                 if line.startswith(f"export {RUN_MARK}=case-1.")]
    assert len(previewed) == 1
