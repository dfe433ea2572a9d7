"""Measured traffic (harness/traffic.py) held to the strategy table's stated formulas
(harness/strategies.py, payloads from harness/shapes.py): every collective of one steady step,
at ws2 and ws4, per strategy and per variant that changes what is sent (noreshard, bf16-reduce,
bucket sizes; ZeRO-3's persistence threshold shows in every zero3 run of the tiny model, where
most tensors are below it)."""

import pytest

from harness import shapes, strategies, traffic
from tests.harness.conftest import EXACT_VARIANTS, LOSSY_VARIANTS, STRATEGIES, WORKLOADS, WS4


def stated(r) -> dict[str, float]:
    parts = r.spec.variant_parts()
    payloads = shapes.payloads(r.spec)
    return strategies.get(r.spec.strategy).stated_bytes(parts, payloads, r.spec.grad_accum)


def check(r, *, buffers: int = 0) -> None:
    assert r.ok, r.describe_failure()
    assert r.traffic_step == r.spec.warmup_steps == 3 and "traffic_steady" not in r.null_reasons
    assert r.checks["traffic_same_on_every_rank"]
    measured = traffic.bytes_by_op(r.traffic)
    if buffers:  # DDP broadcasts the module's buffers (broadcast_buffers=True): not in the formula
        assert measured.pop("broadcast") == buffers
    assert measured and sum(measured.values()) > 0  # a step of a ws>1 run sends something
    assert measured == pytest.approx(stated(r), rel=1e-3), (r.case_id, r.traffic)
    assert {row["group_size"] for row in r.traffic} == {r.spec.world_size}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ws2_traffic_is_the_stated_formula(strategy_results, strategy):
    check(strategy_results[strategy])


@pytest.mark.parametrize("strategy", sorted(WS4))
def test_ws4_traffic_is_the_stated_formula(ws4_results, strategy):
    check(ws4_results[strategy])


SENT_BY_FORMULA = [c for c in EXACT_VARIANTS + LOSSY_VARIANTS if c[1] != "powersgd2"]


@pytest.mark.parametrize("strategy, variant", SENT_BY_FORMULA)
def test_variant_traffic_is_the_stated_formula(variant_results, strategy, variant):
    check(variant_results[(strategy, variant)])


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lora_and_qlora_traffic_is_the_stated_formula(workload_results, strategy, workload):
    """Adapters' gradients only (FSDP1: its units' whole flat parameters), qlora's weights packed.
    DDP also broadcasts the model's buffers (the rotary embedding's), counted from the built model."""
    import torch

    from harness.model import build_model

    r = workload_results[(strategy, workload)]
    model = build_model(r.spec.replace(workload="pretrain"), torch.device("cpu"))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buffers > 0
    check(r, buffers=buffers if strategy == "ddp" else 0)


def test_messages_keep_their_size_from_ws2_to_ws4(strategy_results, ws4_results):
    """What carries a measured message list to any N: only the bus factor changes."""
    compared = [s for s, preset in WS4.items() if preset == "tiny"]
    assert compared
    for s in compared:
        def shape(rows):
            return sorted((r["op"], r["dtype"], r["bytes"], r["count"]) for r in rows)
        assert shape(strategy_results[s].traffic) == shape(ws4_results[s].traffic), s


def test_bucket_variants_split_the_gradients_into_buckets(variant_results, strategy_results):
    """bucket1: messages of at most 1 MiB of gradients plus one tensor (a bucket closes after the
    tensor that crosses its cap); the base's single message is the whole gradient."""
    largest = 4 * max(max(shapes.tensor_numels(strategy_results["ddp"].spec)[0]), 0)
    for case, op, element in ((("ddp", "ac+bucket1"), "all_reduce", 4),
                              (("zero3", "ac-op+bucket1"), "reduce_scatter", 4),
                              (("zero2", "ac-every2+bf16-reduce+bucket1"), "all_reduce", 2)):
        rows = [r for r in traffic.bulk(variant_results[case].traffic) if r["op"] == op]
        assert sum(r["count"] for r in rows) > 2, case  # more than one message per reduction
        assert all(r["bytes"] <= 2**20 * element // 4 + largest for r in rows), case
    base = [r for r in strategy_results["ddp"].traffic if r["op"] == "all_reduce"]
    assert [r["count"] for r in base] == [1]


def test_powersgd_sends_less_than_the_gradients(variant_results, strategy_results):
    """powersgd2 compresses from step 2: its step-3 all_reduce carries rank-2 factors, far below the
    gradients the base sends (not a formula of the table: Variant.projected is False)."""
    sent = traffic.bytes_by_op(variant_results[("ddp", "powersgd2")].traffic)["all_reduce"]
    base = traffic.bytes_by_op(strategy_results["ddp"].traffic)["all_reduce"]
    assert 0 < sent < 0.5 * base
