import json

import pytest

from harness.presets import MODEL_PRESETS
from harness.shapes import param_counts
from harness.spec import RunSpec, SpecError
from harness.spec_file import load_spec


def test_round_trip_through_json():
    spec = RunSpec.from_preset("gpt2-124m", strategy="zero3", world_size=8, nnodes=2, seq_len=1024,
                               dtype="bf16", device="cuda", extra={"note": "x"})
    again = RunSpec.from_dict(json.loads(spec.dumps()))
    assert again == spec
    assert again.nproc_per_node == 4
    assert again.case_id == "zero3-ws8-seq1024"
    assert again.tokens_per_step == 8 * spec.micro_batch * spec.grad_accum * 1024


# Parameter counts of OpenAI's GPT-2 checkpoints as transformers loads them (GPT2LMHeadModel
# num_parameters(): 50,257-token vocabulary, tied head, a bias on every linear layer).
GPT2_PUBLISHED = {"gpt2-124m": 124_439_808, "gpt2-350m": 354_823_168, "gpt2-774m": 774_030_080,
                  "gpt2-1558m": 1_557_611_200}


@pytest.mark.parametrize("preset, published", GPT2_PUBLISHED.items())
def test_gpt2_presets_have_the_checkpoints_shapes(preset, published):
    """With GPT-2's own vocabulary and its linear biases (this GPT leaves biases out, as nanoGPT's
    bias=False, and pads the vocabulary to 50,304), each preset counts the checkpoint's parameters."""
    spec = RunSpec.from_preset(preset, vocab_size=50257)
    biases = spec.n_layer * (3 + 1 + 4 + 1) * spec.n_embd  # qkv, attention out, MLP up, MLP down
    assert param_counts(spec).total + biases == published
    assert MODEL_PRESETS[preset]["vocab_size"] == 50304 and MODEL_PRESETS[preset]["block_size"] == 1024


@pytest.mark.parametrize("changes, field", [
    ({"strategy": "zero4"}, "strategy"),
    ({"seq_len": 4096}, "seq_len"),
    ({"steps": 3, "warmup_steps": 3}, "steps"),
    ({"micro_batch": 0}, "micro_batch"),
    ({"world_size": -1}, "world_size"),
    ({"world_size": 3, "nnodes": 2}, "world_size"),
    ({"n_head": 5}, "n_embd"),
    ({"dtype": "fp8"}, "dtype"),
    ({"lr": 0}, "lr"),
    ({"seq_len": "128"}, "seq_len"),
    ({"betas": (0.9, 1.5)}, "betas"),
    ({"lr": float("nan")}, "lr"),  # accepted before, and then its failure result could not be written
    ({"lr": float("inf")}, "lr"),
])
def test_invalid_fields_are_named(changes, field):
    with pytest.raises(SpecError, match=rf"^{field}:"):
        RunSpec(**changes)


def test_unknown_keys_and_versions_are_refused():
    with pytest.raises(SpecError, match="unknown field.*stratgy"):
        RunSpec.from_dict({"stratgy": "ddp"})
    with pytest.raises(SpecError, match="spec_version"):
        RunSpec.from_dict({"spec_version": 99})
    with pytest.raises(SpecError, match="unknown preset 'gpt5'"):
        RunSpec.from_preset("gpt5")


@pytest.mark.parametrize("value, says", [
    (b"\xff\xfe", "not UTF-8 text"),
    (b"[" * 60_000 + b"]" * 60_000, "nested too deep"),
    (b'{"lr": NaN}', "NaN is not a finite number"),
    (b"[1]", "a run spec is a JSON object"),
])
def test_a_spec_in_the_environment_goes_through_the_spec_files_reader(value, says):
    """``python -m harness --spec env:NAME``: a non-UTF-8 value and JSON nested 60k deep gave tracebacks."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "harness", "--spec", "env:LLMBENCH_TEST_SPEC", "--out",
                           os.devnull], env={**os.environb, b"LLMBENCH_TEST_SPEC": value},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "invalid input: --spec env:LLMBENCH_TEST_SPEC: " in done.stderr and says in done.stderr


def test_ac_every_past_the_depth_is_refused_where_a_case_or_plan_enters(tmp_path):
    """The tiny model has 4 blocks: ac-every5 checkpointed nothing, and ran and was planned under its name."""
    import subprocess
    import sys

    spec = RunSpec.from_preset("tiny", variant="ac-every5")  # the planner's truncated copies are such specs
    assert "ac-every5 checkpoints every 5th block, and the model has 4" in spec.depth_problem()
    assert RunSpec.from_preset("tiny", variant="ac-every4").depth_problem() is None
    (tmp_path / "spec.json").write_text(spec.dumps())
    done = subprocess.run([sys.executable, "-m", "harness", "--spec", str(tmp_path / "spec.json"), "--out",
                           str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "invalid input: variant: ac-every5" in done.stderr
    plan = subprocess.run([sys.executable, "-m", "pytest_llmbench.planner.cli", "--model", "tiny",
                           "--strategy", "ddp", "--world-size", "2", "--seq-len", "64", "--variant",
                           "ac-every5"], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 2 and "ac-every5 checkpoints every 5th block" in plan.stderr, plan.stderr


def test_load_spec_names_the_file(tmp_path):
    with pytest.raises(SpecError, match=f"{tmp_path / 'missing.json'}: cannot read it"):
        load_spec(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match=f"{bad}: not valid JSON"):
        load_spec(bad)
    bad.write_text(json.dumps({"strategy": "nope"}))
    with pytest.raises(SpecError, match=f"{bad}: strategy: unknown value 'nope'"):
        load_spec(bad)
