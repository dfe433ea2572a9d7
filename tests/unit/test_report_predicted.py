"""The step-time model beside the projection (issue 44): a GPU run's strategies are predicted for the
part its driver named, by the same model as ``llmbench-plan --time``, and calibrated by the measured
points; a CPU run has no part and gets none. The GPU run is the committed CPU store relabelled as an
H100 SXM run of the h100 profile (no GPU has run here): what is checked is the arithmetic and the
labels, not an H100's speed."""

import json
import shutil
from pathlib import Path

import pytest

from harness import bookkeeping, devices, strategies
from harness.recompute import Recompute
from harness.shapes import payloads
from pytest_llmbench.planner import configs, step, steptime
from pytest_llmbench.planner.predicted import part_of
from pytest_llmbench.profiles import load_profiles
from pytest_llmbench.report import build_report, load_results
from pytest_llmbench.report.scale import build_scale

DATA = Path(__file__).resolve().parent.parent / "data"


def _as_h100(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(DATA / "store", out)
    for path in (out / "results").glob("*/*.json"):
        data = json.loads(path.read_text())
        data["profile"] = "h100"
        data["env"]["device_name"] = "NVIDIA H100 80GB HBM3"
        path.write_text(json.dumps(data))
    return out


def test_a_gpu_runs_strategies_are_predicted_for_its_part_and_calibrated(tmp_path):
    out = _as_h100(tmp_path)
    profiles = load_profiles([])
    loaded = load_results(out)
    scale = build_scale(loaded, profiles)
    rows = [r for r in scale.predicted if r["profile"] == "h100"]
    assert {r["label"].split(" ")[0] for r in rows} == {"ddp", "zero2", "zero3"}
    for label in {r["label"] for r in rows}:
        mine = {r["world_size"]: r for r in rows if r["label"] == label}
        assert set(mine) >= {2, 8, 256}  # the measured sizes and the profile's projected ones
        # calibrated at the largest measured N: there it is the measured median step
        measured = loaded.frame[(loaded.frame.profile == "h100")
                                & (loaded.frame.strategy_name == label.split(" ")[0])
                                & (loaded.frame.world_size == 2)].step_time_median_s.iloc[0]
        assert mine[2]["calibrated_step_s"] == pytest.approx(measured)
        factor = mine[2]["calibrated_step_s"] / mine[2]["predicted_step_s"]
        for row in mine.values():
            assert row["calibrated_step_s"] == pytest.approx(factor * row["predicted_step_s"])
            assert row["calibrated_on"] == f"measured N=2 (x{factor:.2f})"
    # the uncalibrated figure is the predictor's own, as llmbench-plan --time computes it
    run = next(r for r in loaded.results.values() if r.spec.strategy == "ddp" and r.spec.world_size == 2)
    spec = run.spec
    row, at_8 = strategies.get("ddp"), spec.replace(world_size=8)
    sent = row.stated_bytes(at_8.variant_parts(), payloads(at_8), spec.grad_accum)
    calls = row.stated_calls(at_8.variant_parts(), spec.grad_accum)
    operators = configs.operator_profile(None, spec, micro_batch=spec.micro_batch, seq_len=spec.seq_len)
    work = steptime.Work(spec.micro_batch, spec.seq_len, spec.grad_accum, Recompute(),
                         model_flops_per_token=1.0)
    own = bookkeeping.sizes(at_8.replace(dtype="bf16"), row.bookkeeping, sent, operators.params)
    traffic = steptime.Traffic(sent, calls, 8, step.Network(8, None, 50.0),
                               bookkeeping=bookkeeping.total(row.bookkeeping, own))  # DDP's reducer copies
    assert traffic.bookkeeping > 0
    expected = steptime.predict(operators, devices.get("h100-sxm"), work, traffic, strategy="ddp",
                                shards_optimizer=False)
    ddp8 = next(r for r in rows if r["label"].startswith("ddp") and r["world_size"] == 8)
    assert ddp8["predicted_step_s"] == pytest.approx(expected.step_time_s)
    assert build_report(out, echo=lambda _: None, profiles=profiles) == 0
    report = (out / "report" / "REPORT.md").read_text()
    assert "## Step-time model (estimated)" in report and "| h100 | ddp seq64 | 8 |" in report


def test_which_part_a_run_was_and_why_a_cpu_run_has_none():
    profiles = load_profiles([])
    assert part_of(profiles["h100"], "NVIDIA H100 80GB HBM3")[0].name == "h100-sxm"
    assert part_of(profiles["h100"], "NVIDIA H100 PCIe")[0].name == "h100-pcie"
    assert part_of(profiles["h100"], "NVIDIA H100 NVL")[0].name == "h100-nvl"
    none, why = part_of(profiles["h100"], "")
    assert none is None and "h100-sxm, h100-pcie, h100-nvl" in why  # the profile alone names three parts
    assert part_of(profiles["h200"], "NVIDIA H200")[0].name == "h200"
    none, why = part_of(profiles["h200"], "")  # the SXM part or the NVL card: the GPU's name says which
    assert none is None and "h200, h200-nvl" in why
    assert part_of(profiles["cpu"], "cpu") == (None, "a CPU profile: no part of the device table")
    assert build_scale(load_results(DATA / "store"), profiles).predicted == []
