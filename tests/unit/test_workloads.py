"""Architectures and workloads without a launch: the presets against the published model sizes,
LoRA counts from the model, the FLOPs convention worked by hand, the matrix's workload axis
(ids, markers, skips with reasons) and the report's Workloads section."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.flops import flops_per_token, mfu, non_embedding_params
from harness.hf import build_hf
from harness.model import build_model
from harness.presets import MODEL_PRESETS
from harness.spec import RunSpec, SpecError
from pytest_llmbench import launchers
from pytest_llmbench.cases import build_cases, skip_reason
from pytest_llmbench.profiles import load_profiles
from pytest_llmbench.report import build_report
from pytest_llmbench.report.load import load_results
from pytest_llmbench.report.workloads import workload_rows
from tests.unit.test_trials import settings

META = torch.device("meta")
STORE = Path(__file__).resolve().parent.parent / "data" / "store"


@pytest.mark.parametrize("preset, billions", [
    ("llama3-8b", 8.03), ("mistral-7b", 7.24), ("mistral-7b-v0.3", 7.25), ("qwen2.5-7b", 7.62),
    ("qwen2.5-0.5b", 0.49), ("llama3.2-1b", 1.24), ("llama2-7b", 6.74)])
def test_presets_have_the_published_sizes(preset, billions):
    """The sizes on the model cards, from the parameters transformers builds for the preset."""
    model = build_hf(RunSpec.from_preset(preset, seq_len=128), META)
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == billions


@pytest.mark.parametrize("preset, adapters", [("llama2-7b", 16_777_216), ("mistral-7b", 13_631_488),
                                              ("mistral-7b-v0.3", 13_631_488)])
def test_lora_r16_on_qkvo_counts_what_the_model_has(preset, adapters):
    """The original report's "16.8M trainable parameters" is Llama-2-7B's full multi-head shape;
    Mistral-7B's grouped-query k and v (4096 x 1024) give 13.6M. peft counts it on the model."""
    model = build_model(RunSpec.from_preset(preset, seq_len=128, workload="lora"), META)
    assert model.n_trainable == model.workload_config["peft_trainable_params"] == adapters
    assert model.workload_config["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_the_frozen_weight_convention_worked_by_hand():
    """Mistral-7B QLoRA at seq 512: N = 7,241,732,096 + 13,631,488 adapters - 32000 x 4096 input
    embedding (untied: looked up, never multiplied) = 7,124,291,584; trainable 13,631,488."""
    n_ne = non_embedding_params(n_params=7_241_732_096 + 13_631_488, n_embd=4096, vocab_size=32000,
                                block_size=32768, learned_positions=False, tied_embedding=False)
    assert n_ne == 7_124_291_584
    fpt = flops_per_token(n_params_non_embedding=n_ne, n_layer=32, n_head=32, n_embd=4096, seq_len=512,
                          n_trainable=13_631_488)
    # 4 x 7,110,660,096 frozen + 6 x 13,631,488 trainable + 12 x 32 x 32 x 128 x 512 attention
    assert fpt == 28_442_640_384 + 81_788_928 + 805_306_368 == 29_329_735_680
    assert fpt < flops_per_token(n_params_non_embedding=n_ne, n_layer=32, n_head=32, n_embd=4096,
                                 seq_len=512)  # 6N would count weight gradients nobody computes
    # 1,000 tokens/s on one A10 (125 TFLOP/s dense bf16): 29.33 TFLOP/s of model FLOPs, 23.5% MFU
    assert mfu(flops_per_token=fpt, tokens_per_s_per_device=1000, peak_flops_per_s=125e12) == \
        pytest.approx(0.23464, abs=1e-5)


def test_specs_name_bad_fields_and_old_specs_read_as_gpt_pretraining():
    for changes, field in [({"workload": "dpo"}, "workload"), ({"arch": "gptj"}, "arch"),
                           ({"lora_dropout": 1.5}, "lora_dropout"), ({"lora_rank": 0}, "lora_rank"),
                           ({"n_kv_head": 3}, "n_kv_head"), ({"ffn_hidden": 0}, "ffn_hidden")]:
        with pytest.raises(SpecError, match=field):
            RunSpec.from_preset("tiny-mistral", **changes)
    old = RunSpec.from_preset("tiny").to_dict()
    for name in ("arch", "n_kv_head", "ffn_hidden", "tie_embeddings", "workload", "lora_rank", "lora_alpha",
                 "lora_dropout", "lora_targets"):
        del old[name]
    old["spec_version"] = 2
    spec = RunSpec.from_dict(old)
    assert spec.arch == "gpt" and spec.workload == "pretrain" and spec == RunSpec.from_preset("tiny")
    assert MODEL_PRESETS["tiny-mistral"]["arch"] == "mistral"


def test_the_matrix_has_a_workload_axis_with_ids_markers_and_reasons():
    profiles = load_profiles()
    cases = build_cases({"a10-qlora": profiles["a10-qlora"]}, settings())
    ids = [c.id for c in cases]
    assert "a10-qlora-qlora-ddp+ac-ws4-seq512" in ids and len(ids) == 15
    case = next(c for c in cases if c.spec.strategy == "zero3" and c.spec.world_size == 4)
    assert case.spec.lora_dropout == 0.05 and case.spec.model == "mistral-7b-v0.3"
    assert profiles["a10-qlora"].markers == ("a10",) and profiles["a10-qlora"].usd_per_device_hour == 0.60
    fsdp = next(c for c in cases if c.spec.strategy == "fsdp")
    assert "bitsandbytes issue #1945" in skip_reason(fsdp, launchers.get("k8s"), [])
    assert skip_reason(case, launchers.get("k8s"), []) is None
    mistral = build_cases({"cpu-mistral": profiles["cpu-mistral"]}, settings(workload=["qlora"]))
    assert {c.spec.workload for c in mistral} == {"qlora"} and len(mistral) == 10
    gpt = build_cases({"cpu": profiles["cpu"]}, settings(workload=["lora"], strategy=["ddp"]))
    assert "fine-tunes a Hugging Face architecture" in skip_reason(gpt[0], launchers.get("local"), [])


def stored(name: str) -> dict:
    return json.loads(next(STORE.glob(f"results/*/{name}.json")).read_text())


@pytest.fixture
def tuned_store(tmp_path):
    """The committed tiny-GPT runs relabelled as a tiny Mistral pretrained and LoRA-tuned, with
    tokens/s and trainable counts set by hand."""
    folder = tmp_path / "results" / "20261201T000000Z-work"
    folder.mkdir(parents=True)
    shape = {k: v for k, v in MODEL_PRESETS["tiny-mistral"].items()}
    for ws in (1, 2):
        base = stored(f"tinycpu-ddp-ws{ws}-seq64")
        base["spec"].update(shape, model="tiny-mistral")
        base["metrics"]["n_trainable_params"] = base["n_params"]
        (folder / f"tinycpu-ddp-ws{ws}-seq64.json").write_text(json.dumps(base))
        lora = json.loads(json.dumps(base))
        lora["spec"]["workload"] = "lora"
        lora["run_id"] += "-lora"
        lora["metrics"]["tokens_per_s"] = base["metrics"]["tokens_per_s"] * 1.5
        lora["metrics"]["n_trainable_params"] = 28_672
        (folder / f"tinycpu-lora-ddp-ws{ws}-seq64.json").write_text(json.dumps(lora))
    return tmp_path


def test_the_report_compares_workloads_and_never_ranks_across_them(tuned_store):
    rows = workload_rows(load_results(tuned_store))
    assert [(r["world_size"], r["workload"], r["plain"]) for r in rows] == [
        (1, "pretrain", "ddp"), (1, "lora", "ddp"), (2, "pretrain", "ddp"), (2, "lora", "ddp")]
    assert rows[1]["trainable_share"] == pytest.approx(28_672 / rows[1]["n_params"])
    assert build_report(tuned_store, echo=lambda _: None) == 0
    csv = pd.read_csv(tuned_store / "report" / "metrics.csv")
    lora2 = csv[(csv.strategy == "lora-ddp") & (csv.world_size == 2)].iloc[0]
    assert lora2.workload == "lora" and lora2.n_trainable_params == 28_672
    assert lora2.usd_per_thousand_samples == pytest.approx(1e3 * 64 / lora2.tokens_per_usd)
    assert lora2.samples_per_s == pytest.approx(lora2.tokens_per_s / 64)
    report = (tuned_store / "report" / "REPORT.md").read_text()
    assert "## Workloads" in report and "| tinycpu | 64 | 2 | ddp | lora | 28,672 |" in report
    assert "13,631,488 on Mistral-7B" in report
    winners = report.split("## Winners")[1].split("## Recommendations")[0]
    assert "| tinycpu (lora) |" in winners and "lora-ddp (" not in winners  # ddp never ranked against it
    # its own scaling table
    assert "**tinycpu, seq 64, lora: weak scaling (same per-device batch)**" in report


def test_qlora_never_holds_the_fp32_model_on_its_device():
    """QLoRA builds on the meta device and makes each module real on the target device, each linear
    quantised as it is made: the device's peak over the build is the packed model plus one fp32
    matrix. On 37c90cc transformers built the whole fp32 model on the device first (Mistral-7B:
    27 GiB on a 22 GiB A10, every a10-qlora case an OOM). Counted by PyTorch's own MemTracker on
    CPU (the target device here) at Mistral-7B-v0.3's real width (hidden 4096, FFN 14336, vocab
    32768, GQA 8 heads) and one decoder layer (10 s: the 32 real layers quantise in ~4 min on 2
    cores); each layer is made and quantised alone, so depth adds packed bytes only, and the
    32-layer peak follows from this layer's."""
    from torch.distributed._tools.mem_tracker import MemTracker

    spec = RunSpec.from_preset("mistral-7b-v0.3", workload="qlora", n_layer=1, seq_len=128)
    cpu = torch.device("cpu")
    tracker = MemTracker()
    with tracker:
        model = build_model(spec, cpu)
    peak = tracker.get_tracker_snapshot("peak")[cpu]["Total"]
    params = list(model.parameters())
    held = sum(p.untyped_storage().nbytes() for p in params)
    largest = 14336 * 4096 * 4  # the largest fp32 matrix it quantises (gate/up/down_proj)
    dense = sum(p.numel() for p in build_hf(spec.replace(workload="pretrain"), META).parameters()) * 4
    assert held + largest <= dense, "the packed model plus one matrix must be below the fp32 model"
    assert peak <= held + 1.05 * largest, (peak / 2**30, held / 2**30)
    packed = [p for p in params if getattr(p, "quant_state", None) is not None]
    assert len(packed) == 7 and model.n_params == dense // 4 + model.n_trainable  # counted dense
    # the same build at Mistral-7B's 32 layers (a10-qlora: 22 GiB usable on an A10): this layer's
    # packed bytes 31 times more, against the fp32 model 37c90cc built first (on the meta device)
    layer = model.lm.base_model.model.model.layers[0]
    whole = held + 31 * sum(p.untyped_storage().nbytes() for p in layer.parameters()) + largest
    full = build_hf(spec.replace(n_layer=32, workload="pretrain"), META)
    fp32 = sum(p.numel() for p in full.parameters()) * 4
    assert whole / 2**30 < 6 and fp32 / 2**30 > 26  # 5.1 GiB to build, against 27.0 GiB
