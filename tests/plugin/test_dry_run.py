"""``--llmbench-dry-run``: every selected case's spec and what its launcher would run, written under
the output folder, nothing run, exit 0, with no cluster to reach (pytest_llmbench/dryrun.py). The
local preview is run as written: it is the command the case would run."""

import json
import subprocess

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
