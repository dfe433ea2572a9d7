"""``llmbench-plan``: the planner as users ask it."""

from __future__ import annotations

import json

from pytest_llmbench.plan_cli import main


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
    assert doc["activation_bytes"] > 0
    (entry,) = doc["plans"]
    terms = entry["world_sizes"]["2"]["terms"]
    assert {t["name"] for t in terms} >= {"weights", "optimizer", "gradients", "gathered"}
    assert sum(t["bytes"] for t in terms) == entry["world_sizes"]["2"]["total_bytes"]


def test_plan_errors_name_the_flag(capsys):
    assert main(["--model", "gpt9"]) == 2
    assert "unknown preset 'gpt9'" in capsys.readouterr().err
    assert main(["--model", "tiny", "--strategy", "ddp,tp", "--activation-gib", "1"]) == 2
    assert "unknown strategy 'tp'" in capsys.readouterr().err
    assert main(["--model", "gpt2-124m", "--seq-len", "512", "--workload", "qlora",
                 "--activation-gib", "1"]) == 2
    assert "qlora" in capsys.readouterr().err
