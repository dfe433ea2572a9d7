"""``--llmbench-dry-run``: every selected case's spec and what its launcher would run, written under
the output folder, nothing run, exit 0, with no cluster to reach (pytest_llmbench/dryrun.py). The
local preview is run as written: it is the command the case would run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def test_each_launcher_writes_what_it_would_run_and_runs_nothing(suite, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))  # no cluster anywhere
    files = {}
    for launcher in ("local", "slurm", "k8s"):
        result = suite.runpytest_subprocess(
            "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1,2",
            f"--llmbench-launcher={launcher}", "--llmbench-dry-run", f"--llmbench-output={launcher}-out",
            "-p", "no:cacheprovider")
        assert result.ret == 0, result.stdout.str()[-2000:]
        result.assert_outcomes(skipped=2)
        result.stdout.fnmatch_lines(["*llmbench dry run: every selected case's spec and what it would run "
                                     "are in *; nothing ran*"])
        assert not (suite.path / f"{launcher}-out" / "results").exists()  # nothing ran, nothing stored
        (session,) = (suite.path / f"{launcher}-out" / "dry-run").iterdir()
        assert sorted(p.name for p in session.iterdir()) == ["tinycpu-ddp-ws1-seq64", "tinycpu-ddp-ws2-seq64"]
        files[launcher] = session / "tinycpu-ddp-ws2-seq64"
        spec = json.loads((files[launcher] / "spec.json").read_text())
        assert spec["world_size"] == 2 and spec["strategy"] == "ddp"
    assert sorted(p.name for p in files["slurm"].iterdir()) == ["job.sh", "sbatch.txt", "spec.json",
                                                                "task.sh"]
    assert (files["slurm"] / "sbatch.txt").read_text().startswith("sbatch --parsable --job-name=llmbench-")
    manifests = list(yaml.safe_load_all((files["k8s"] / "manifests.yaml").read_text()))
    assert [m["kind"] for m in manifests] == ["Job", "ConfigMap", "Service", "NetworkPolicy"]
    # the local preview is the case's own command: run as written, it runs the case
    local = files["local"]
    done = subprocess.run(["sh", "torchrun.sh"], cwd=local, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = json.loads((local / "result.json").read_text())
    assert ran["status"] == "ok" and ran["spec"]["world_size"] == 2


@pytest.mark.parametrize("args, wrote", [
    (["--llmbench-launcher=k8s", "--llmbench-k8s-kind=trainjob"], "manifests.yaml"),
    (["--llmbench-launcher=slurm"], "sbatch.txt"),
])
def test_the_a10_matrix_dry_runs_from_the_repository_root_without_a_cluster(tmp_path, args, wrote):
    """As a user types it: `pytest -m a10 --llmbench-launcher=k8s --llmbench-k8s-kind=trainjob
    --llmbench-dry-run` from the repository root, no kubeconfig and no Slurm anywhere."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "a10", *args, "--llmbench-dry-run",
                           f"--llmbench-output={tmp_path / 'out'}", "-p", "no:cacheprovider", "-q"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (session,) = (tmp_path / "out" / "dry-run").iterdir()
    cases = sorted(p for p in session.iterdir() if "collectives" not in p.name)
    assert len(cases) >= 20 and all((case / wrote).is_file() for case in cases)
    if "--llmbench-k8s-kind=trainjob" in args:
        kinds = {doc["kind"] for case in cases for doc in yaml.safe_load_all((case / wrote).read_text())}
        assert kinds == {"TrainJob", "NetworkPolicy"}


def test_the_slurm_batch_script_carries_its_options_as_sbatch_lines(suite, tmp_path):
    """`sbatch job.sh` on its own submits what the case would: every option of the launcher's sbatch
    command is a #SBATCH line of the script (it had none: the options were only on the command line)."""
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=2",
        "--llmbench-launcher=slurm", "--llmbench-dry-run", "--llmbench-output=out", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:]
    (case,) = (p for p in (suite.path / "out" / "dry-run").glob("*/*") if "ws2" in p.name)
    script = (case / "job.sh").read_text().splitlines()
    directives = [line.removeprefix("#SBATCH ") for line in script if line.startswith("#SBATCH ")]
    command = (case / "sbatch.txt").read_text().split()
    assert directives == [a for a in command[1:-1] if a != "--parsable"]
    assert "--nodes=1" in directives and any(d.startswith("--time=") for d in directives)
    first_command = next(i for i, s in enumerate(script) if s.startswith("exec"))
    assert script[0] == "#!/bin/bash"
    assert first_command > max(i for i, s in enumerate(script) if s.startswith("#SBATCH"))


@pytest.mark.parametrize("value, ran", [("y", False), ("enabled", False), ("off", True), ("maybe", None)])
def test_the_dry_run_switch_takes_the_same_words_as_every_switch(suite, monkeypatch, value, ran):
    """LLMBENCH_DRY_RUN=y was read as off, and with a kubeconfig every case was submitted."""
    monkeypatch.setenv("LLMBENCH_DRY_RUN", value)
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "-p", "no:cacheprovider", "--collect-only" if ran else "-q")
    if ran is None:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*environment LLMBENCH_DRY_RUN: 'maybe' is not a switch value*"])
    elif ran:
        assert result.ret == 0  # collected only: off means a real run, not tried here
    else:
        assert result.ret == 0, result.stdout.str()[-2000:]
        result.assert_outcomes(skipped=1)
        assert (suite.path / "out" / "dry-run").is_dir()


def test_a_dry_run_folder_that_is_a_file_is_a_usage_error(suite):
    (suite.path / "out").mkdir()
    (suite.path / "out" / "dry-run").write_text("not a folder")
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--llmbench-dry-run",
        "--llmbench-output=out", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*command line --llmbench-dry-run: *dry-run exists and is not a folder*"])


def test_a_case_the_launcher_would_refuse_fails_its_dry_run_and_pod_security_is_warned(suite, tmp_path):
    """A TrainJob that cannot carry the RDMA host network across nodes: refused by name, a failed test
    (it exited 0 before, the refusal only in CANNOT-RUN.txt). As an Indexed Job the same case runs, and
    the dry run warns that its pods need Pod Security 'privileged'."""
    profile = "devices_per_node = 1\n" + (suite.path / "tinycpu.toml").read_text() + \
        '\n[k8s]\nrdma = "BM.GPU.H100.8"\n'  # ws2 spans two nodes: the RDMA host network
    (suite.path / "rdma.toml").write_text(profile)
    common = ("-m", "rdma", "--llmbench-profile-file=rdma.toml", "--strategy=ddp", "--world-size=2",
              "--llmbench-launcher=k8s", "--llmbench-dry-run", "-p", "no:cacheprovider")
    refused = suite.runpytest_subprocess(*common, "--llmbench-k8s-kind=trainjob", "--llmbench-output=tj")
    assert refused.ret == pytest.ExitCode.TESTS_FAILED
    refused.stdout.fnmatch_lines(
        ["*dry run: the k8s launcher would refuse this case: *host_network or k8s.rdma*"])
    job = suite.runpytest_subprocess(*common, "--llmbench-output=job")
    assert job.ret == 0, job.stdout.str()[-2000:]
    job.stdout.fnmatch_lines(["*dry run: WARNING: these pods need Pod Security level 'privileged' "
                              "(host namespaces (hostNetwork=true)*a namespace whose "
                              "pod-security.kubernetes.io/enforce label is 'baseline' or 'restricted' "
                              "refuses them"])
