"""The commands a user types first, typed as a user would: from the repository root, with no
path argument (a test that always passes a path once hid a root that did not collect)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_at_root(*args: str, output: Path) -> subprocess.CompletedProcess:
    """``pytest ARGS`` in the repository root. The output folder comes from the environment
    (not a flag, so the command stays the user's), and no GPU is visible, so GPU cases skip
    on any host."""
    env = {**os.environ, "LLMBENCH_OUTPUT": str(output), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_plain_pytest_collects_the_benchmark_suite(tmp_path):
    proc = pytest_at_root("--collect-only", "-q", output=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert "tests/benchmarks/test_training.py::test_training[cpu-ddp-ws2-seq128]" in ids
    assert "tests/benchmarks/test_training.py::test_training[a10-zero2-ws4-seq1024]" in ids
    assert all(line.startswith("tests/benchmarks/") for line in ids)  # testpaths: the suite


def test_the_design_card_command_skips_gpu_cases_with_their_reason(tmp_path):
    proc = pytest_at_root("-m", "a10", "--strategy=zero2", output=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 skipped" in proc.stdout  # a10's 3 and a10-qlora's 3 (its markers name a10)
    assert "a10-zero2-ws1-seq1024 needs 1 CUDA device(s) on this host; found 0" in proc.stdout
    assert "a10-qlora-qlora-zero2+ac-ws1-seq512 needs 1 CUDA device(s) on this host; found 0" in proc.stdout


def test_a_cpu_case_from_the_root(tmp_path):
    """The README's ``pytest -m cpu --strategy=ddp --world-size=2 --seq-len=128`` (fewer steps)."""
    proc = pytest_at_root("-m", "cpu", "--strategy=ddp", "--world-size=2", "--seq-len=128",
                          "--llmbench-steps=6", output=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    stored = {p.name: json.loads(p.read_text()) for p in (tmp_path / "results").glob("*/*.json")}
    assert sorted(stored) == ["cpu-ddp-ws1-seq128.json", "cpu-ddp-ws2-seq128.json"]  # baseline first
    assert all(r["status"] == "ok" for r in stored.values())
    assert (tmp_path / "report" / "REPORT.md").exists()


@pytest.mark.parametrize("visible, expected", [("", 0), ("0", 1), ("0,1", 2), (None, 4)])
def test_cuda_visible_devices_narrows_the_gpus_a_case_may_use(monkeypatch, visible, expected):
    from pytest_llmbench import cases

    listing = "".join(f"GPU {i}: NVIDIA A10 (UUID: GPU-{i})\n" for i in range(4))
    monkeypatch.setattr(cases.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(cases.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr=""))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert len(cases.local_gpus()) == expected
