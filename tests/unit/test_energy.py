"""Energy counters (harness/energy.py) read from trees and readings the tests control: RAPL's
package domains summed and taken across a wrap-around, one reader per host, NVML's absence said,
and the metrics derived from them."""

from pathlib import Path

import pytest

from harness import energy
from harness.derive import derive_metrics
from harness.spec import RunSpec


def powercap(root: Path, packages: dict[str, tuple[int, int]]) -> Path:
    """A powercap tree: {domain: (energy_uj, max_energy_range_uj)}, plus a core subzone of each
    package (inside the package's count: never added again)."""
    for name, (value, top) in packages.items():
        for domain in (root / name, root / f"{name}:0"):
            domain.mkdir(parents=True)
            (domain / "energy_uj").write_text(f"{value}\n")
            (domain / "max_energy_range_uj").write_text(f"{top}\n")
    return root


def test_rapl_sums_the_packages_and_survives_a_wrap(tmp_path):
    top = 2**32 - 1
    root = powercap(tmp_path, {"intel-rapl:0": (1_000_000, top), "intel-rapl:1": (top + 1 - 500_000, top)})
    rapl = energy.Rapl(root)
    assert [d.name for d in rapl.domains] == ["intel-rapl:0", "intel-rapl:1"]
    before = rapl.read()
    (root / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # +2.5 J
    (root / "intel-rapl:1" / "energy_uj").write_text("1000000\n")  # wrapped: +0.5 J + 1.0 J
    assert rapl.joules(before, rapl.read()) == pytest.approx(2.5 + 1.5, abs=1e-6)


def test_no_counter_is_an_empty_reading_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(energy.POWERCAP_ENV, str(tmp_path))
    meter = energy.Meter("cpu", local_rank=0)
    meter.start()
    meter.stop()
    reading = meter.reading()
    assert reading["joules"] is None and "no RAPL package domain under" in reading["reason"]
    other = energy.Meter("cpu", local_rank=1).reading()
    assert other["joules"] is None and other["reason"] == "the host's RAPL counter is read by local rank 0"
    assert energy.total([reading, other]) == (None, reading["reason"])


def test_nvml_missing_says_which_package_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    reading = energy.Meter("cuda", local_rank=0).reading()
    assert reading["joules"] is None and "nvidia-ml-py" in reading["reason"]


def test_one_host_reading_per_host_and_the_metrics_from_it():
    host = {"joules": 12.0, "source": "RAPL intel-rapl:0 (the host's packages)", "scope": "host",
            "reason": None}
    other = {"joules": None, "source": None, "scope": "host",
             "reason": "the host's RAPL counter is read by local rank 0"}
    joules, basis = energy.total([host, other])
    assert joules == 12.0 and basis.startswith("1 host(s)' CPU packages (every process on them")
    gpus = [{"joules": 5.0, "source": f"NVML total energy, GPU {i}", "scope": "device", "reason": None}
            for i in range(2)]
    assert energy.total(gpus)[0] == 10.0
    spec = RunSpec(world_size=2, micro_batch=4, grad_accum=2, seq_len=64)
    metrics, nulls = derive_metrics(spec, n_params=1000, n_trainable=1000, step_times_s=[0.5, 0.5],
                                    compute_only_step_times_s=[], losses=[1.0], memory_per_rank=[],
                                    device_name="cpu", energy_per_rank=[host, other])
    tokens = spec.tokens_per_step * 2
    assert metrics["energy_j"] == 12.0 and metrics["joules_per_token"] == pytest.approx(12.0 / tokens)
    assert metrics["tokens_per_kwh"] == pytest.approx(3.6e6 * tokens / 12.0)
    empty, why = derive_metrics(spec, n_params=1000, n_trainable=1000, step_times_s=[0.5],
                                compute_only_step_times_s=[], losses=[1.0], memory_per_rank=[],
                                device_name="cpu", energy_per_rank=[{**other, "reason": "no powercap"}])
    assert empty["joules_per_token"] is None and why["joules_per_token"] == "no powercap"


def test_the_report_shows_energy_or_why_there_is_none(tmp_path):
    """One stored case with a RAPL reading, the others from before energy was read."""
    import json
    import shutil

    from pytest_llmbench.report import build_report

    store = Path(__file__).resolve().parent.parent / "data" / "store"
    shutil.copytree(store / "results", tmp_path / "results")
    path = next((tmp_path / "results").glob("*/tinycpu-ddp-ws2-seq64.json"))
    data = json.loads(path.read_text())
    basis = "1 host(s)' CPU packages (every process on them, not only this run's)"
    data["metrics"].update(energy_j=12.5, joules_per_token=0.0025, tokens_per_kwh=1.44e9, energy_basis=basis)
    path.write_text(json.dumps(data))
    assert build_report(tmp_path, echo=lambda _: None) == 0
    report = (tmp_path / "report" / "REPORT.md").read_text()
    energy_part = report.split("## Energy")[1].split("## Figures")[0]
    assert "| tinycpu | ddp | 2 | 64 | 12.5 | 0.0025 | 1,440,000,000 | 1 host(s)' CPU packages" in energy_part
    assert "| tinycpu | ddp | 1 | 64 | - | - | - | not recorded" in energy_part


def test_nvml_finds_the_ranks_gpu_by_uuid_not_by_index(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=3,5 torch's cuda:1 is the host's GPU 5, but NVML's index 1 is
    the host's GPU 1: the memory read after the loop (harness/train.py) and the energy counter
    both look the GPU up by the UUID torch reports. (37c90cc read memory by index.)"""
    import sys
    from types import SimpleNamespace

    import torch

    from harness.train import _nvml_used_gib

    asked = []
    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: asked.append(uuid) or uuid,
        nvmlDeviceGetHandleByIndex=lambda index: asked.append(index) or f"index {index}",
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(used=2 * 1024**3 if handle == "GPU-5" else 0))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    uuids = {0: "3", 1: "5"}  # CUDA_VISIBLE_DEVICES=3,5
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=uuids[index]))
    assert _nvml_used_gib(torch.device("cuda", 1)) == 2.0
    assert asked == ["GPU-5"]


def test_the_cuda_reserve_is_what_the_driver_uses_beyond_the_allocator(monkeypatch):
    """On a GPU each rank records what its allocator does not hold (the CUDA context, NCCL's buffers:
    total - free - reserved, the driver's mem_get_info against torch's memory_reserved) and what the
    allocator held beyond its tensors at the peak: what the planner's "fits" cannot see (issue 43's
    CUDA reserve), measured on the first GPU run. Here torch.cuda answers as an 80 GB part would."""
    import torch

    from harness.train import cuda_reserve

    gib = 1024**3
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 69 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 72 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 66.5 * gib)
    assert cuda_reserve(torch.device("cuda", 0)) == {"device_total_gib": 80.0, "outside_allocator_gib": 1.0,
                                                     "allocator_slack_gib": 5.5}
