"""``llmbench-plan``: the planner as users ask it."""

from __future__ import annotations

import json

import pytest

from harness import strategies
from pytest_llmbench.planner.cli import main


def test_plan_table_and_fits_sentences(capsys):
    assert main(["--model", "llama3-8b", "--strategy", "ddp,fsdp", "--world-size", "1,8,64",
                 "--grad-accum", "1,2", "--activation-gib", "5", "--device-memory-gib", "44"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Estimated per-device memory (GiB): llama3-8b pretrain")
    assert "declared (--activation-gib)" in out
    # FSDP at grad_accum 2 holds the unsharded gradient: 44 GiB L40S fit from 8 at 1, from 64 at 2
    assert "- grad_accum 1: fsdp fits from N=8 (estimated at N=8" in out
    assert "- grad_accum 2: fsdp fits from N=64 (estimated at N=64" in out
    assert "- grad_accum 1: ddp does not fit at any N up to 64" in out
    assert "no_sync accumulation" in out


def test_plan_json_measures_activations(capsys):
    assert main(["--model", "tiny-llama", "--seq-len", "64", "--strategy", "zero3", "--world-size", "2",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["estimated"] is True and doc["activation_source"].startswith("measured under FakeTensorMode")
    assert doc["activation_bytes"]["zero3"] > 0
    (entry,) = doc["plans"]
    terms = entry["world_sizes"]["2"]["terms"]
    assert {t["name"] for t in terms} >= {"weights", "optimizer", "gradients", "gathered"}
    assert sum(t["bytes"] for t in terms) == entry["world_sizes"]["2"]["total_bytes"]


def test_bf16_plans_measure_activations_as_each_strategy_computes(capsys):
    """--precision bf16: DDP computes under autocast over fp32 weights (the weights' bf16 casts are
    saved for backward), ZeRO in bf16 weights; fp32 computes alike for every strategy."""
    argv = ["--model", "tiny-llama", "--seq-len", "64", "--strategy", "ddp,zero2,zero3", "--world-size", "2",
            "--json"]
    assert main([*argv, "--precision", "bf16"]) == 0
    bf16 = json.loads(capsys.readouterr().out)["activation_bytes"]
    assert main(argv) == 0
    fp32 = json.loads(capsys.readouterr().out)["activation_bytes"]
    assert len(set(fp32.values())) == 1
    assert bf16["zero2"] == bf16["zero3"] < fp32["zero3"] < bf16["ddp"]


def test_plan_errors_name_the_flag(capsys):
    assert main(["--model", "gpt9"]) == 2
    assert "unknown preset 'gpt9'" in capsys.readouterr().err
    assert main(["--model", "tiny", "--strategy", "ddp,tp", "--activation-gib", "1"]) == 2
    assert "unknown strategy 'tp'" in capsys.readouterr().err
    assert main(["--model", "gpt2-124m", "--seq-len", "512", "--workload", "qlora",
                 "--activation-gib", "1"]) == 2
    assert "qlora" in capsys.readouterr().err


def test_step_time_worked_by_hand(capsys):
    """gpt2-350m ddp at N=8, 450 GB/s: one all_reduce of 4P bytes, 2 x 7/8 bus factor (nccl-tests);
    compute = tokens x FLOPs per token (harness/flops.py, PaLM's formula) / (989e12 x 0.4)."""
    from harness.bandwidth import bus_factor
    from harness.shapes import param_counts, spec_flops_per_token
    from harness.spec import RunSpec
    from pytest_llmbench.planner import mfu

    spec = RunSpec.from_preset("gpt2-350m", seq_len=1024, micro_batch=8)
    ddp = strategies.get("ddp")
    t = mfu.step_time(ddp, spec, 8, grad_accum=2, peak_flops=989e12, mfu=0.4, busbw_gbps=450)
    p = param_counts(spec).total
    assert t.comm_s == {"all_reduce": pytest.approx(4 * p * bus_factor("all_reduce", 8) / 450e9)}
    assert t.compute_s == pytest.approx(8 * 1024 * 2 * spec_flops_per_token(spec) / (989e12 * 0.4))
    assert t.step_s == pytest.approx(t.compute_s + t.comm_s["all_reduce"])  # nothing hidden
    assert t.samples_per_s == pytest.approx(8 * 8 * 2 / t.step_s)
    hidden = mfu.step_time(ddp, spec, 8, grad_accum=2, peak_flops=989e12, mfu=0.4, busbw_gbps=450,
                            overlap=1)
    assert hidden.step_s == pytest.approx(t.compute_s)
    zero3 = strategies.get("zero3")
    one = mfu.step_time(zero3, spec, 1, grad_accum=2, peak_flops=989e12, mfu=0.4, busbw_gbps=450)
    assert one.comm_s == {} and one.step_s == pytest.approx(t.compute_s)


def test_the_flops_per_token_from_a_shape_is_derives_on_the_built_model():
    import torch

    from harness.derive import derive_metrics
    from harness.model import build_model
    from harness.shapes import spec_flops_per_token
    from harness.spec import RunSpec

    for spec in (RunSpec.from_preset("tiny", seq_len=64),
                 RunSpec.from_preset("tiny-mistral", seq_len=64, workload="lora")):
        model = build_model(spec, torch.device("cpu"))
        metrics, _ = derive_metrics(spec, n_params=model.n_params, n_trainable=model.n_trainable,
                                    step_times_s=[1.0], compute_only_step_times_s=[], losses=[1.0],
                                    memory_per_rank=[], device_name="cpu")
        assert spec_flops_per_token(spec) == metrics["flops_per_token"], spec.model


def test_plan_from_a_profile_with_step_times(capsys):
    assert main(["--profile", "h100", "--strategy", "ddp,fsdp", "--activation-gib", "2", "--mfu", "0.4"]) == 2
    assert "h100's match three parts" in capsys.readouterr().err  # SXM, PCIe or NVL: never guessed
    assert main(["--profile", "h100", "--strategy", "ddp,fsdp", "--activation-gib", "2", "--mfu", "0.4",
                 "--peak-tflops", "989"]) == 0
    out = capsys.readouterr().out
    assert "MFU 40% (stated) of 989 TFLOP/s" in out
    assert "declared intra_node_busbw_gbps (profile h100)" in out  # N <= 8 GPUs per node
    assert "declared inter_node_busbw_gbps (profile h100)" in out  # N = 16
    assert main(["--model", "tiny", "--seq-len", "64", "--activation-gib", "1", "--mfu", "0.4"]) == 2
    assert "--mfu needs a peak" in capsys.readouterr().err
    assert main(["--profile", "nope"]) == 2
    assert "no such profile" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, says", [
    ("--world-size", "1000000000", "at most 1,048,576"),   # 37c90cc: a list per rank, 7.8 GiB
    ("--device-memory-gib", "nan", "'nan' is not a finite number above 0"),
    ("--device-memory-gib", "-80", "'-80' is not a finite number above 0"),
    ("--activation-gib", "inf", "'inf' is not a finite number at least 0"),
    ("--activation-gib", "-1", "'-1' is not a finite number at least 0"),
    ("--peak-tflops", "inf", "'inf' is not a finite number above 0"),  # 37c90cc: ZeroDivisionError
    ("--busbw-gbps", "nan", "'nan' is not a finite number above 0"),
    ("--mfu", "1.5", "'1.5' is not a finite number in (0, 1]"),
    ("--overlap", "-0.1", "'-0.1' is not a finite number in [0, 1]"),
    ("--seq-len", "0", "comma-separated positive integers")])
def test_every_number_is_checked_where_it_enters(capsys, flag, value, says):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "tiny", "--activation-gib", "1", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and says in err, err


def test_a_profile_file_is_read_even_without_profile_and_json_stays_json(capsys, tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text("model = [\n")
    assert main(["--model", "tiny", "--activation-gib", "1", "--profile-file", str(bad)]) == 2
    assert "mine.toml" in capsys.readouterr().err  # 37c90cc never read it without --profile
    assert main(["--model", "tiny", "--seq-len", "64", "--world-size", "1,2", "--strategy", "zero3",
                 "--activation-gib", "0.5", "--device-memory-gib", "80", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    terms = {t["name"]: t["formula"] for t in doc["plans"][0]["world_sizes"]["2"]["terms"]}
    assert terms["activations"] == "declared per micro-batch (--activation-gib)"  # not "measured"


def test_check_prints_each_reference_under_its_name_with_the_error_and_warns_beyond_the_bounds(
        capsys, monkeypatch):
    """--check runs FSDPMemTracker and DeepSpeed's engine (here on tiny-llama, seconds), prints each
    under its own name with estimate/reference - 1 per N, keeps the reference's categories under
    its name in --json (37c90cc called every reference "fsdp_mem_tracker_bytes"), and warns when
    the estimate is more than 3% under or 10% over a reference."""
    from pytest_llmbench.planner import references

    argv = ["--model", "tiny-llama", "--seq-len", "64", "--strategy", "fsdp,zero3", "--world-size", "2",
            "--check"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    refs = {p["strategy"]: p["world_sizes"]["2"]["reference"] for p in doc["plans"]}
    assert (refs["fsdp"]["name"], refs["zero3"]["name"]) == ("FSDPMemTracker", "DeepSpeed engine")
    for ref, plan_ in zip(refs.values(), doc["plans"], strict=True):
        total = plan_["world_sizes"]["2"]["total_bytes"]
        assert ref["error"] == pytest.approx(total / ref["categories"]["total"] - 1)
        assert {"activation", "total"} <= set(ref["categories"])
    monkeypatch.setattr(references, "UNDER", -1.0)  # any error is then "under": the warning names it
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "  FSDPMemTracker" in out and "  est/ref - 1" in out
    assert "warning: fsdp grad_accum 1 N=2: the estimate is" in err and "against FSDPMemTracker" in err
