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
    env.pop("LLMBENCH_SESSION_REPORT")  # the user's default: the full report (tests/conftest.py)
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
    # a10's 3, a10-qlora's 3 (its markers name a10) and a10's collectives probes at ws2 and ws4 (the
    # probe has no strategy: --strategy does not narrow it)
    assert "8 skipped" in proc.stdout
    assert "a10-zero2-ws1-seq1024 needs 1 CUDA device(s) on this host; found 0" in proc.stdout
    assert "a10-collectives-ws2 spans 2 nodes; run it with --llmbench-launcher=k8s" in proc.stdout
    assert "a10-qlora-qlora-zero2+ac-ws1-seq512 needs 1 CUDA device(s) on this host; found 0" in proc.stdout


def test_a_cpu_case_from_the_root(tmp_path):
    """The README's ``pytest -m cpu --strategy=ddp --world-size=2 --seq-len=128`` (fewer steps)."""
    proc = pytest_at_root("-m", "cpu", "--strategy=ddp", "--world-size=2", "--seq-len=128",
                          "--llmbench-steps=6", output=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout  # the case and the cpu profile's collectives probe at ws2
    stored = {p.name: json.loads(p.read_text()) for p in (tmp_path / "results").glob("*/*.json")}
    assert sorted(stored) == ["cpu-collectives-ws2.json", "cpu-ddp-ws1-seq128.json",
                              "cpu-ddp-ws2-seq128.json"]
    assert all(r["status"] == "ok" for r in stored.values())
    check_the_probe(stored["cpu-collectives-ws2.json"])
    ws2 = stored["cpu-ddp-ws2-seq128.json"]["metrics"]
    assert ws2["exposed_comm_s"] == pytest.approx(  # the split, from this run's and its baseline's medians
        (ws2["step_time_median_s"] - ws2["compute_only_step_time_s"]) - ws2["wrapper_overhead_s"])
    report = (tmp_path / "report" / "REPORT.md").read_text()
    assert "## Collectives" in report and "| cpu | 2 | 1 | 4,194,304 |" in report
    assert "## Projection (projected, not measured)" in report
    assert "| cpu | ddp seq128 | 256 | measured (probe ws2, one node) |" in report
    assert "| cpu | ddp seq128 | 2 |" in report.split("Validation, leave one world size out")[1]
    assert (tmp_path / "report" / "plots" / "collectives.png").exists()


def check_the_probe(probe: dict) -> None:
    """Every row's busbw from its own size and time, with nccl-tests' factors written out here; the
    sweep 8 B to the profile's 4 MiB in x2 steps; the per-operation timing of the largest all_reduce
    agrees with the loop's time per operation."""
    factors = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": (2 - 1) / 2, "reduce_scatter": (2 - 1) / 2,
               "broadcast": 1.0}
    rows = probe["collectives"]
    assert [r["size_bytes"] for r in rows if r["op"] == "all_reduce"] == [8 * 2**i for i in range(20)]
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9 * factors[r["op"]])
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
    largest = rows[19]["time_s"]
    each = sorted(probe["step_times_s"])[len(probe["step_times_s"]) // 2]
    assert largest / 4 < each < largest * 4  # the same operation, timed two ways
    assert probe["metrics"]["busbw_gbps_all_reduce"] == rows[19]["busbw_gbps"]


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
