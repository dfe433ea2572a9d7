"""The variant axis: parsing, case ids, what applies where, and the configs the GPU-only
variants produce (offload cannot run on this CPU-only machine)."""

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, ShardingStrategy

from harness.parallel.deepspeed import deepspeed_config
from harness.parallel.fsdp import shard_options
from harness.parallel.fsdp1 import wrap_options
from harness.spec import RunSpec, SpecError
from pytest_llmbench.profiles import ProfileError, load_profile
from tests.unit.test_trials import DATA, matrix


def test_case_ids_carry_the_variant_only_when_it_is_not_the_base():
    assert RunSpec(strategy="fsdp", world_size=8, seq_len=128).case_id == "fsdp-ws8-seq128"
    assert RunSpec(strategy="fsdp", world_size=8, seq_len=128, variant="ac").case_id == "fsdp+ac-ws8-seq128"
    assert RunSpec(variant="ac+bucket100").variant_parts() == {"ac": None, "bucket": 100}


@pytest.mark.parametrize("variant, message", [
    ("powersgd", "unknown part 'powersgd'"), ("bucket0", "unknown part 'bucket0'"),
    ("ac4", "unknown part 'ac4'"), ("ac+ac", "'ac' appears twice"), ("fast", "unknown part 'fast'"),
    ("powersgd4+bf16-reduce", "both DDP communication hooks"),
])
def test_bad_variants_are_spec_errors_naming_the_part(variant, message):
    with pytest.raises(SpecError, match=message):
        RunSpec(variant=variant)


@pytest.mark.parametrize("strategy, variant, reason", [
    ("fsdp", "powersgd4", "PowerSGD is a DDP communication hook"),
    ("fsdp1", "bucket25", "FSDP reduces per wrapped unit"),
    ("ddp", "noreshard", "only FSDP reshards"),
    ("ddp", "offload", "DDP keeps a full replica"),
    ("zero3", "offload", "meaningless on a CPU-only run"),
    ("ddp", "bf16-reduce", "torch refuses on gloo"),
    ("fsdp", "hsdp", "this case runs on one node"),
    ("zero3", "hsdp", "HSDP here is FSDP2 fully_shard on a 2-D device mesh"),
])
def test_what_does_not_apply_says_why(strategy, variant, reason):
    assert reason in RunSpec(strategy=strategy, variant=variant).variant_problem()


def test_what_applies_has_no_problem():
    for strategy, variant in [("ddp", "ac+powersgd4+bucket100"), ("fsdp", "ac+noreshard+bf16-reduce"),
                              ("zero3", "bucket50+bf16-reduce"), ("zero2", "offload")]:
        device = "cuda" if "offload" in variant else "cpu"
        assert RunSpec(strategy=strategy, variant=variant, device=device).variant_problem() is None
    assert RunSpec(strategy="fsdp", variant="hsdp", world_size=16, nnodes=2).variant_problem() is None


def test_a_version_1_spec_is_read_as_the_base_variant():
    data = RunSpec(strategy="zero2").to_dict()
    del data["variant"]
    data["spec_version"] = 1
    assert RunSpec.from_dict(data).variant == "base"


def test_zero_configs_of_the_variants():
    spec = RunSpec(strategy="zero3", device="cuda", variant="bucket100+bf16-reduce+offload")
    config = deepspeed_config(spec)
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 100 * 2**20 // 4  # MiB of fp32 gradients, in elements
    assert config["communication_data_type"] == "bf16"
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert config["zero_force_ds_cpu_optimizer"] is False  # the client AdamW stays, as for every strategy
    zero2 = deepspeed_config(RunSpec(strategy="zero2", device="cuda", variant="offload"))["zero_optimization"]
    assert "offload_optimizer" in zero2 and "offload_param" not in zero2  # ZeRO-2 keeps parameters
    plain = deepspeed_config(RunSpec(strategy="zero2"))
    assert "communication_data_type" not in plain and plain["zero_optimization"]["reduce_bucket_size"] == 5e7


def test_fsdp_options_of_the_variants():
    options = shard_options({"noreshard": None, "bf16-reduce": None, "offload": None})
    assert options["reshard_after_forward"] is False
    assert isinstance(options["offload_policy"], CPUOffloadPolicy)
    assert options["mp_policy"].reduce_dtype == torch.bfloat16 and options["mp_policy"].param_dtype is None
    assert shard_options({}) == {"reshard_after_forward": True}
    options = wrap_options({"noreshard": None, "offload": None})
    assert options["sharding_strategy"] == ShardingStrategy.SHARD_GRAD_OP
    assert options["cpu_offload"].offload_params is True
    assert wrap_options({}) == {"sharding_strategy": ShardingStrategy.FULL_SHARD}


def test_bf16_is_each_strategys_own_mixed_precision_unless_the_variant_autocast_says_otherwise():
    """RunSpec.precision picks it; the wrappers' options and DeepSpeed's config follow (issue 22 item 3)."""
    def spec(strategy, variant="base", dtype="bf16", workload="pretrain"):
        return RunSpec(strategy=strategy, variant=variant, dtype=dtype, workload=workload,
                       model="tiny-mistral" if workload != "pretrain" else "gpt2-124m")
    assert {s: spec(s).precision for s in ("ddp", "fsdp", "fsdp1", "zero2", "zero3")} == {
        "ddp": "autocast", "fsdp": "native", "fsdp1": "native", "zero2": "native", "zero3": "native"}
    assert spec("fsdp", "autocast").precision == "autocast"
    assert spec("zero3", dtype="fp32").precision == "fp32"
    assert spec("fsdp1", workload="qlora").precision == "autocast"  # NF4 in fp32 containers: never cast
    assert spec("fsdp1", workload="lora").precision == "native"
    assert "dtype is fp32" in spec("zero2", "autocast", dtype="fp32").variant_problem()
    assert "DDP's bf16 is torch.autocast already" in spec("ddp", "autocast").variant_problem()
    native = deepspeed_config(spec("zero2"))
    assert native["bf16"] == {"enabled": True} and "torch_autocast" not in native
    parity = deepspeed_config(spec("zero2", "autocast"))
    assert parity["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "bf16" not in parity
    policy = shard_options({}, native=True)["mp_policy"]
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert shard_options({"bf16-reduce": None}, native=True)["mp_policy"].reduce_dtype == torch.bfloat16
    mixed = wrap_options({}, native=True)["mixed_precision"]
    assert (mixed.param_dtype, mixed.reduce_dtype, mixed.buffer_dtype) == (torch.bfloat16, torch.float32,
                                                                           torch.bfloat16)


def test_the_matrix_has_a_variant_axis_from_the_profile_or_the_flag(tmp_path):
    cases = matrix(variant=["base", "ac"], strategy=["ddp"], world_size=[2])
    assert [c.id for c in cases] == ["tinycpu-ddp-ws2-seq64", "tinycpu-ddp+ac-ws2-seq64"]
    assert cases[1].at_world_size(1).spec.variant == "ac"  # its baseline is the same variant at ws1
    path = tmp_path / "mine.toml"
    path.write_text('variants = ["base", "ac+bucket100"]\n' + (DATA / "tinycpu.toml").read_text())
    assert load_profile(path).variants == ("base", "ac+bucket100")
    path.write_text('variants = ["ac+zip"]\n' + (DATA / "tinycpu.toml").read_text())
    with pytest.raises(ProfileError, match=r"mine.toml: key 'variants': unknown part 'zip'"):
        load_profile(path)


def test_whether_the_planner_plans_and_times_a_variant_is_on_its_row(monkeypatch):
    """Issue 62: the planner reads a variant's ``unplanned`` and ``untimed`` from its row (with their
    reasons), never a list of names of its own: a row that gains a reason is refused with it."""
    import dataclasses

    from harness.variants import VARIANTS
    from pytest_llmbench.planner import memory, timing

    offload = RunSpec(strategy="fsdp", world_size=8, seq_len=128, variant="offload", device="cuda")
    assert timing.problem(offload, 8, 8) == f"variant offload: {VARIANTS['offload'].untimed}"
    assert memory.unplanned({"offload": None}) == VARIANTS["offload"].unplanned != ""
    reduce = RunSpec(strategy="fsdp", world_size=8, seq_len=128, variant="bf16-reduce", device="cuda")
    assert timing.problem(reduce, 8, 8) is None and memory.unplanned(reduce.variant_parts()) == ""
    monkeypatch.setitem(VARIANTS, "bf16-reduce", dataclasses.replace(
        VARIANTS["bf16-reduce"], untimed="no model of it here", unplanned="no plan of it here"))
    assert timing.problem(reduce, 8, 8) == "variant bf16-reduce: no model of it here"
    assert memory.of_run(reduce) is None
    from pytest_llmbench.planner import validation

    assert validation.row_variant({"recompute": "full"}) == "ac"  # the published word, on ac's row
