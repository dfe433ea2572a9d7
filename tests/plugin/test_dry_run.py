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
