"""Variants of each strategy at ws2 on CPU/gloo: the exact ones follow the base loss curve,
the lossy ones train and their gap to the base is measured; each records what it set."""

import pytest

from tests.harness.conftest import EXACT_VARIANTS, LOSSY_VARIANTS
from tests.harness.test_strategies import LOSS_TOLERANCE


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("strategy, variant", EXACT_VARIANTS + LOSSY_VARIANTS)
def test_variant_trains_and_is_recorded(variant_results, strategy, variant):
    r = variant_results[(strategy, variant)]
    assert r.ok, r.describe_failure()
    assert r.case_id == f"{strategy}+{variant}-ws2-seq64"
    assert r.strategy_config["variant"] == variant
    assert r.losses[-1] < r.losses[0]  # it learns
    assert r.metrics["step_overhead"] is not None  # the probe ran with the same recompute


@pytest.mark.parametrize("strategy, variant", EXACT_VARIANTS)
def test_exact_variants_follow_the_base_loss_curve(variant_results, strategy_results, strategy, variant):
    run, base = variant_results[(strategy, variant)], strategy_results["ddp"]
    assert run.ok and base.ok and len(base.losses) == base.spec.steps  # two real curves, not two empty ones
    assert run.losses == pytest.approx(base.losses, abs=LOSS_TOLERANCE)


def test_lossy_variants_are_measurably_not_the_base(variant_results, strategy_results):
    """PowerSGD rank 2 compresses from step 2 on: the curve leaves the base's by far more than
    float noise. bf16 reduction rounds every gradient: a gap above the exact strategies' own
    (~1e-6) but small. The report prints these gaps beside each variant's speed."""
    base = strategy_results["ddp"].losses
    assert len(base) == strategy_results["ddp"].spec.steps
    assert gap(variant_results[("ddp", "powersgd2")].losses, base) > 10 * LOSS_TOLERANCE
    for case in (("fsdp", "bf16-reduce"), ("zero2", "ac-every2+bf16-reduce+bucket1")):
        assert 1e-5 < gap(variant_results[case].losses, base) < 0.05, case


def test_each_variant_records_what_it_set(variant_results):
    ac = "every Block, torch checkpoint_wrapper NO_REENTRANT, applied before wrapping"
    ddp = variant_results[("ddp", "ac+bucket1")].strategy_config
    assert ddp["bucket_cap_mb"] == 1 and ddp["activation_checkpointing"] == ac
    fsdp = variant_results[("fsdp", "ac-op+noreshard")].strategy_config
    assert fsdp["reshard_after_forward"] is False
    assert fsdp["activation_checkpointing"].startswith("every Block, torchtitan's op-level selective policy")
    fsdp1 = variant_results[("fsdp1", "ac-every2+noreshard")].strategy_config
    assert fsdp1["sharding_strategy"] == "SHARD_GRAD_OP"
    assert fsdp1["activation_checkpointing"].startswith("every 2th Block (1-based), torch checkpoint_wrapper")
    zero3 = variant_results[("zero3", "ac-op+bucket1")].strategy_config
    zero = zero3["deepspeed_config"]["zero_optimization"]
    assert zero["reduce_bucket_size"] == 2**20 // 4  # 1 MiB of fp32 gradients, in elements
    hook = variant_results[("ddp", "powersgd2")].strategy_config["comm_hook"]
    assert hook.startswith("powerSGD_hook(matrix_approximation_rank=2, start_powerSGD_iter=2")
    policy = variant_results[("fsdp", "bf16-reduce")].strategy_config["mp_policy"]
    assert "reduce_dtype=torch.bfloat16" in policy
    zero2 = variant_results[("zero2", "ac-every2+bf16-reduce+bucket1")].strategy_config["deepspeed_config"]
    assert zero2["communication_data_type"] == "bf16"
    assert zero2["zero_optimization"]["reduce_bucket_size"] == 2**20 // 4
