"""tools/gpu_smoke.sh, docs/GPU.md's first steps as one command, on a machine without a GPU: it says so
and exits 3 with no traceback, whether nvidia-smi is missing, lists nothing, or lists a GPU that no Python
here can use. Its Python half (tools/gpu_smoke.py) is held here on files: the case spec the plugin
builds, the planner's part for each GPU name, and the summary of measured beside predicted."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.spec import RunSpec
from pytest_llmbench.planner import cli as plan_cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
import gpu_smoke  # noqa: E402

TOOLS = ("bash", "date", "mkdir", "dirname", "tee", "grep", "head", "env", "ip", "ls", "cat", "timeout",
         "mktemp", "rm", "tar", "gzip", "cp", "mv", "tr", "sed", "sleep")


def smoke(tmp_path: Path, nvidia_smi: str | None, out: Path | None = None, python: str = sys.executable,
          **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS:
        if shutil.which(tool) and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(sys.executable)  # a torch without CUDA, as on this machine
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYTHON": python, "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_smoke.sh"), str(out or tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def unpacked(out: Path, into: Path) -> Path:
    into.mkdir()
    subprocess.run(["tar", "-xzf", str(out / "details.tar.gz"), "-C", str(into)], check=True)
    return into


@pytest.mark.parametrize(("nvidia_smi", "says"), [
    (None, "nvidia-smi is not installed"),
    ('echo "No devices were found"; exit 6', "nvidia-smi lists no GPU (No devices were found)"),
    ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"', "no Python here imports a torch that sees a GPU"),
    ("sleep 600", "nvidia-smi -L did not answer within 2 s"),
])
def test_without_a_gpu_it_says_so_and_exits_3_without_a_traceback(tmp_path, nvidia_smi, says):
    done = smoke(tmp_path, nvidia_smi, SMI_S="2")
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"no usable NVIDIA GPU on this host: {says}" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["details.tar.gz", "steps.log"]
    assert says in (out / "steps.log").read_text()
    assert not list(unpacked(out, tmp_path / "details").glob("cases/*"))  # nothing was run
    assert not list(tmp_path.glob("gpu-smoke.*"))  # its working folder is gone


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.write_text("a file"), "exists and is not a folder"),
    (lambda p: (p.mkdir(), (p / "summary.txt").write_text("an earlier run")), "is not empty"),
    (lambda p: p.symlink_to(p.parent), "is a symbolic link"),
])
def test_an_out_that_is_a_file_a_link_or_holds_a_result_is_refused_untouched(tmp_path, make, says):
    out = tmp_path / "given"
    make(out)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    done = smoke(tmp_path, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"', out=out)
    assert done.returncode == 2 and f"OUT {out} (argument) {says}" in done.stderr, done.stderr
    after = sorted(str(p) for p in tmp_path.rglob("*") if not str(p).startswith(str(tmp_path / "bin")))
    assert after == [p for p in before if not p.startswith(str(tmp_path / "bin"))]  # nothing written


def test_every_step_is_held_to_the_budget_and_out_gets_four_files(tmp_path):
    """A GPU 'seen' by a Python whose torchrun never returns (a hung NCCL init): the case ends at what
    the budget has left, the profile is the H200's (from the GPU's name, not a hard-coded h100), the
    run ends within its total, and OUT gets the summary, the log and one tarball: nothing else."""
    fake = tmp_path / "fake-python"
    fake.write_text(f"""#!/bin/bash
case "$*" in
  *torch.cuda.is_available*) exit 0 ;;
  *torch.distributed.run*) exec sleep 600 ;;
  *"gpu_smoke.py versions"*) echo {{}}; exit 0 ;;  # (the rest only costs the test time on a CPU)
  *"gpu_smoke.py device"*|*"import deepspeed"*|*"import pytest"*) exit 1 ;;
esac
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    import time

    started = time.monotonic()
    done = smoke(tmp_path, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-8a1)"', python=str(fake), BUDGET_S="8")
    took = time.monotonic() - started
    out = tmp_path / "out"
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 8 + 40
    assert sorted(p.name for p in out.iterdir()) == ["details.tar.gz", "steps.log", "summary.json",
                                                     "summary.txt"]
    log = (out / "steps.log").read_text()
    assert "GPU 0: NVIDIA H200 -> profile h200" in log
    assert "ddp-ws1: exit 124" in log  # its torchrun stopped by the step's timeout
    details = unpacked(out, tmp_path / "details")
    spec = RunSpec.from_dict(json.loads((details / "cases" / "ddp-ws1" / "spec.json").read_text()))
    assert spec.device == "cuda" and spec.strategy == "ddp"
    assert json.loads((out / "summary.json").read_text())["cases"][0]["status"] == "no result"


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A10", "a10"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s"), ("NVIDIA B200", None), ("", None)])
def test_the_profile_comes_from_the_gpu_name(name, profile):
    assert gpu_smoke.profile(name) == profile


def test_the_case_is_the_h100_profiles_as_the_plugin_builds_it(tmp_path):
    said = gpu_smoke.spec("h100", "fsdp", str(tmp_path / "spec.json"))
    spec = RunSpec.from_dict(json.loads((tmp_path / "spec.json").read_text()))
    assert spec.device == "cuda" and spec.strategy == "fsdp" and spec.world_size == 1
    assert spec.model == "gpt2-350m" and said.startswith("fsdp: gpt2-350m")


@pytest.mark.parametrize(("name", "part"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA B200", "b200"), ("NVIDIA X9", None)])
def test_the_planner_part_comes_from_the_gpu_name(name, part):
    assert gpu_smoke.device(name) == part


def test_the_summary_puts_each_measurement_beside_its_prediction(tmp_path, capsys):
    """A stored CPU ddp result stands in for the GPU's; the prediction is the planner's own --json."""
    case = tmp_path / "cases" / "ddp-ws1"
    case.mkdir(parents=True)
    stored = json.loads(next(DATA.glob("store/results/*/tinycpu-ddp-ws1-seq64.json")).read_text())
    (case / "result.json").write_text(json.dumps(stored))
    (case / "torchrun.log").write_text("NCCL INFO NET/Socket : Using [0]eth0\n"
                                       "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n")
    (tmp_path / "cases" / "fsdp-ws1").mkdir()
    (tmp_path / "cases" / "fsdp-ws1" / "torchrun.log").write_text("CUDA error: out of memory\n")
    assert plan_cli.main(["--profile", "h100", "--time", "--device", "h100-sxm", "--world-size", "1",
                          "--strategy", "ddp,fsdp", "--json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    assert gpu_smoke.main(["summary", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "summary.json").read_text())
    ddp, fsdp = data["cases"]
    assert ddp["status"] == "ok" and ddp["predicted_step_s"] > 0
    assert ddp["measured_over_predicted_step"] == pytest.approx(ddp["step_s"] / ddp["predicted_step_s"])
    assert ddp["nccl_transports"] == ["P2P/CUMEM"]  # the channel line, not the NET/Socket plugin line
    assert fsdp == {"case": "fsdp-ws1", "status": "no result", "log_tail": ["CUDA error: out of memory"]}
    text = (tmp_path / "summary.txt").read_text()
    assert "ddp-ws1" in text and "P2P/CUMEM" in text and "CUDA error: out of memory" in text
    assert os.path.getsize(tmp_path / "summary.json") > 0
