"""The host's hardware picks the profile: GPU names as the driver reports them.

A fake ``nvidia-smi`` on PATH stands in for the driver, so the plugin runs as it would on a
GPU host (its cases are only collected or skipped here, never launched)."""

import os
import stat

import pytest

from pytest_llmbench import cases, launchers
from pytest_llmbench.cases import Case, host_profiles, make_spec, skip_reason
from pytest_llmbench.profiles import ProfileError, load_profiles, parse_profile

PROFILES = load_profiles()


@pytest.mark.parametrize("gpu, expected", [
    ("NVIDIA A10", ["a10", "a10-qlora"]), ("NVIDIA A100-SXM4-80GB", ["a100"]),
        ("NVIDIA A100 80GB PCIe", ["a100"]),
    ("NVIDIA H100 80GB HBM3", ["h100"]), ("NVIDIA H100 PCIe", ["h100"]), ("NVIDIA H200", ["h200"]),
    ("NVIDIA L40S", ["l40s"]), ("NVIDIA A10G", []), ("NVIDIA L40", []), ("NVIDIA L4", []),
    ("NVIDIA H100 NVL", ["h100"]), ("NVIDIA H200 NVL", ["h200"]),
    ("NVIDIA A100-SXM4-40GB", []),  # a 40 GB A100 is another part: the a100 profile plans for 80 GB
])
def test_driver_names_pick_the_profile(gpu, expected):
    assert sorted(host_profiles(PROFILES, [gpu])) == expected


def test_no_gpu_picks_the_cpu_profiles():
    assert sorted(host_profiles(PROFILES, [])) == ["cpu", "cpu-mistral"]


def test_a_gpu_case_skips_on_another_gpu_and_counts_only_its_own_kind():
    a10, h100 = PROFILES["a10"], PROFILES["h100"]
    local = launchers.get("local")
    reason = skip_reason(Case(a10, make_spec(a10, "ddp", 1, 1024)), local, ["NVIDIA H100 80GB HBM3"])
    assert reason.startswith("a10-ddp-ws1-seq1024: this host's GPU is 'NVIDIA H100 80GB HBM3'; the a10 "
                             "profile is for a10 (parts in")
    h100_host = ["NVIDIA H100 80GB HBM3"]
    assert skip_reason(Case(h100, make_spec(h100, "ddp", 1, 1024)), local, h100_host) is None
    two = skip_reason(Case(h100, make_spec(h100, "ddp", 2, 1024)), local, h100_host)
    assert two.startswith("h100-ddp-ws2-seq1024 needs 2 CUDA device(s) on this host; found 1")
    k8s = launchers.get("k8s")
    assert skip_reason(Case(a10, make_spec(a10, "ddp", 1, 1024)), k8s, []) is None  # the cluster decides


def test_a_cuda_profile_must_say_which_gpus_it_is_for():
    data = {"device": "cuda", "dtype": "bf16", "model": "tiny", "micro_batch": 1, "grad_accum": 1, "steps": 3,
            "warmup_steps": 1, "strategies": ["ddp"], "world_sizes": [1], "seq_lens": [64]}
    with pytest.raises(ProfileError, match="key 'parts': required for device = \"cuda\""):
        parse_profile("mine", data, source="mine.toml")
    with pytest.raises(ProfileError, match="key 'parts': 'h900' is not a part of the device table; known"):
        parse_profile("mine", {**data, "parts": ["h900"]}, source="mine.toml")
    mine = parse_profile("mine", {**data, "parts": ["a100-40gb"]}, source="mine.toml")
    assert mine.runs_on("NVIDIA A100-SXM4-40GB") and not mine.runs_on("NVIDIA A100-SXM4-80GB")
    assert mine.memory_gib == pytest.approx(40537 / 1024)  # the part's memory, as its driver reports it
    with pytest.raises(ProfileError, match="not below the device's 39.6 GiB"):
        parse_profile("mine", {**data, "parts": ["a100-40gb"], "thresholds": {"max_peak_memory_gib": 41.0}},
                      source="mine.toml")
    with pytest.raises(ProfileError, match="'\\[' is not a regular expression"):
        parse_profile("mine", {**data, "device_names": ["["]}, source="mine.toml")
    mine = parse_profile("mine", {**data, "device_names": ["L40S"]}, source="mine.toml")
    assert mine.runs_on("NVIDIA L40S") and not mine.runs_on("NVIDIA L4")


def fake_driver(folder, *names: str) -> dict:
    """An environment whose nvidia-smi lists these GPUs."""
    script = folder / "bin" / "nvidia-smi"
    script.parent.mkdir()
    lines = "".join(f"GPU {i}: {name} (UUID: GPU-{i})\\n" for i, name in enumerate(names))
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}"}


def test_local_gpus_reads_the_driver_and_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_driver(tmp_path, "NVIDIA A10", "NVIDIA H100 PCIe")["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cases.local_gpus() == ["NVIDIA A10", "NVIDIA H100 PCIe"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert cases.local_gpus() == ["NVIDIA H100 PCIe"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cases.local_gpus() == []


def test_auto_selects_the_host_profile(suite, monkeypatch):
    result = suite.runpytest_subprocess("-m", "auto", "--collect-only", "-q", "--strategy=ddp",
                                        "--seq-len=128")
    result.stdout.fnmatch_lines(["test_suite.py::test_training[cpu-mistral-ddp-ws1-seq128]",
                                 "test_suite.py::test_training[cpu-mistral-qlora-ddp-ws2-seq128]",
                                 "test_suite.py::test_training[cpu-ddp-ws1-seq128]",
                                 "test_suite.py::test_training[cpu-ddp-ws2-seq128]",
                                 "8/* tests collected*"])  # both CPU profiles
    for key, value in fake_driver(suite.path, "NVIDIA H100 80GB HBM3").items():
        monkeypatch.setenv(key, value)
    result = suite.runpytest_subprocess("-m", "auto", "--collect-only", "-q", "--strategy=ddp")
    result.stdout.fnmatch_lines(["test_suite.py::test_training[h100-ddp-ws1-seq1024]", "*tests collected*"])
    result.stdout.no_fnmatch_line("*cpu-ddp*")
    result = suite.runpytest_subprocess("-m", "a10 and pretrain", "--strategy=ddp", "--world-size=1", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*this host's GPU is 'NVIDIA H100 80GB HBM3'; the a10 profile is for a10*"])


def test_auto_on_a_gpu_no_profile_is_made_for(suite, monkeypatch):
    for key, value in fake_driver(suite.path, "NVIDIA L4").items():
        monkeypatch.setenv(key, value)
    result = suite.runpytest_subprocess("-m", "auto", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    message = ("*-m auto: no profile is made for this host's GPU 'NVIDIA L4' (profiles and the GPU "
               "parts they are for: a10-qlora: a10; a10: a10;*--llmbench-profile-file=FILE*")
    result.stderr.fnmatch_lines([message])
