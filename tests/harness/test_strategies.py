import json
import socket
from pathlib import Path

import pytest
import torch

from harness import strategies
from harness.derive import derive_metrics
from harness.strategies import BUILTIN
from pytest_llmbench.launchers.local.launcher import rank_logs
from pytest_llmbench.planner import memref

STRATEGIES = [s.name for s in BUILTIN]  # the built-in rows of the strategy table

LOSS_TOLERANCE = 2e-3  # measured: equal to 4 decimals; clipping order may differ in float


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_trains_and_its_metrics_agree_with_its_raw_data(strategy_results, strategy):
    r = strategy_results[strategy]
    assert r.ok, r.describe_failure()
    spec = r.spec
    assert len(r.step_times_s) == spec.steps - spec.warmup_steps
    assert len(r.warmup_step_times_s) == spec.warmup_steps
    assert len(r.losses) == spec.steps
    assert len(r.memory_per_rank) == 2 and all(m["peak_rss_gib"] > 0 for m in r.memory_per_rank)
    # every rank's own times: the step's time is the slowest rank's, each on this host
    assert [p["rank"] for p in r.per_rank] == [0, 1]
    assert {p["node"] for p in r.per_rank} == {socket.gethostname()}
    for name in ("step_times_s", "compute_only_step_times_s"):
        each = zip(*(p[name] for p in r.per_rank), strict=True)
        assert [max(step) for step in each] == getattr(r, name), name
    again, _ = derive_metrics(spec, n_params=r.n_params, n_trainable=r.metrics["n_trainable_params"],
                              step_times_s=r.step_times_s,
                              compute_only_step_times_s=r.compute_only_step_times_s, losses=r.losses,
                              memory_per_rank=r.memory_per_rank, device_name=r.env["device_name"],
                              per_rank=r.per_rank)
    for key in ("tokens_per_s", "step_time_median_s", "peak_memory_gib", "flops_per_token",
                "step_overhead", "straggler_ratio", "slowest_rank"):
        assert r.metrics[key] == pytest.approx(again[key]), key
    assert r.metrics["tokens_per_s"] == pytest.approx(
        2 * 4 * 2 * 64 / (sum(r.step_times_s) / len(r.step_times_s)))
    assert r.strategy_config["strategy"] == strategy
    assert r.strategy_config["precision"] == "fp32"
    assert r.env["torch"].startswith("2.")


def test_every_strategy_follows_the_ddp_loss_curve(strategy_results):
    reference = strategy_results["ddp"].losses
    assert reference[-1] < reference[0]  # it learns
    for strategy in STRATEGIES:
        losses = strategy_results[strategy].losses
        assert losses == pytest.approx(reference, abs=LOSS_TOLERANCE), strategy


def test_zero_strategies_record_their_deepspeed_config(strategy_results):
    for strategy in ("zero2", "zero3"):
        config = strategy_results[strategy].strategy_config["deepspeed_config"]
        assert config["zero_optimization"]["stage"] == int(strategy[-1])
        assert config["train_batch_size"] == 4 * 2 * 2  # explicit integers from the spec
        assert config["gradient_clipping"] == 1.0


def test_no_deepspeed_op_was_built(strategy_results, tmp_path_factory):
    """No case may pay a JIT op build: nothing lands in TORCH_EXTENSIONS_DIR, no build log."""
    root = tmp_path_factory.getbasetemp() / "strategies0"
    ext = root / "torch_extensions"
    assert not ext.exists() or not any(ext.iterdir())
    for strategy in ("zero2", "zero3"):
        logs = rank_logs(root / strategy)
        assert len(logs) == 2
        assert not any("built successfully" in text for text in logs.values())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_traced_steps_give_each_rank_a_chrome_trace_and_its_overlap(strategy_results, strategy):
    """Every rank's trace is a Chrome trace in the run folder; its split adds up to the step, and
    at two ranks every strategy communicates in every step."""
    r = strategy_results[strategy]
    assert len(r.instruments["trace"]) == len(r.per_rank) == 2
    for rank, t in enumerate(r.instruments["trace"]):
        events = json.loads(Path(t["file"]).read_text())["traceEvents"]
        assert Path(t["file"]).name == f"rank{rank}.json" and Path(t["file"]).parent.name == "trace"
        assert sum(e.get("name") == "llmbench.step" for e in events) == len(t["steps"]) == 2
        for step in t["steps"]:
            assert step["comm_s"] > 0 and step["compute_s"] > 0
            parts = step["compute_s"] + step["exposed_comm_s"] + step["idle_s"]
            assert parts == pytest.approx(step["step_s"], rel=1e-9)
            assert 0 <= step["hidden_comm_s"] <= min(step["comm_s"], step["compute_s"])
        assert t["top_ops"] and "llmbench.step" not in {op["name"] for op in t["top_ops"]}
    assert 0 < r.metrics["trace_exposed_comm"] < 1 and 0 < r.metrics["trace_idle"] < 1
    assert r.phases_s["trace_s"] > 0


# (planner term, tracker categories) that mean the same bytes, per strategy, at ws2 and grad_accum 2
SAME_BYTES = {
    "ddp": [("weights", ("parameter",)), ("gradients", ("gradient",)), ("optimizer", ("optstate",))],
    "fsdp": [("weights", ("sharded_param",)), ("gradients", ("unsharded_grad",)),
             ("optimizer", ("optstate",))],
    "zero2": [("weights", ("parameter",)), ("optimizer", ("optstate",))],
    "zero3": [("optimizer", ("optstate",))],
}
# (planner term, what DeepSpeed's optimizer made at initialize, read off it: the row's held,
# harness/strategies.py);
SAME_HELD = {
    "zero2": [("master copy", "master_copy")],
    "zero3": [("weights", "weight_shard"), ("master copy", "master_copy"),
              ("gradients", "gradient_partition")],
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_rank_measures_memory_by_category_and_the_planner_agrees(strategy_results, strategy):
    """One step under PyTorch's own tracker (--llmbench-memory) on every rank. Where a planner term
    and a tracker category mean the same tensors, they agree within 5% (the issue's bar; they are
    equal here): FSDP2's fp32 shard, DDP's and FSDP2's accumulated gradients (no_sync at
    grad_accum 2), every strategy's AdamW moments. DeepSpeed's gradients are its reduce bucket,
    allocated at the full reduce_bucket_size whatever the model's size (stage_1_and_2.py
    setup_buckets, stage3.py __init__): the tiny model's 1M parameters sit in a 50M-element bucket;
    ZeRO-2 holds a second (overlap_comm), ZeRO-3 none, and the planner's buckets are exactly these.
    What DeepSpeed's optimizer made before the tracker started, read off it, is the planner's too:
    ZeRO-2's fp32 master partition, ZeRO-3's weight shard, fp32 master and gradient partition.
    (ZeRO-3 means to reuse an fp32 weight shard as its master, stage3.py _create_fp32_partitions,
    but compares ``tensor.device == "cpu"``, False in torch: it clones, 4 B x P_t / N.)"""
    from pytest_llmbench.planner import memory as plan

    r = strategy_results[strategy]
    tracked = r.instruments["memory"]
    assert len(tracked) == 2
    if strategy == "fsdp1":
        assert all("non-leaf" in t["error"] for t in tracked), tracked
        return
    assert all(t["tracker"] == ("FSDPMemTracker" if strategy == "fsdp" else "MemTracker") for t in tracked)
    spec = r.spec
    backward, _ = plan.moments(strategy, plan.Shape.of(spec), 2, grad_accum=spec.grad_accum, foreach=False)
    terms = backward.by_category()  # the tracker's peak: the tiny model's activations
    for t in tracked:
        peak = t["peak_bytes"]
        assert peak["total"] == sum(v for k, v in peak.items() if k != "total") and peak["activation"] > 0
        for term, categories in SAME_BYTES[strategy]:
            assert sum(peak[c] for c in categories) == pytest.approx(terms[term], rel=0.05), (term, peak)
        if strategy in ("zero2", "zero3"):  # the buckets, allocated whole: the planner counts them so
            bucket = 4 * plan.ZERO_REDUCE_BUCKET
            assert peak["gradient"] == bucket  # the one the gradients view
            second = peak["temp"] >= bucket  # ZeRO-2's buf_1 (overlap_comm) is a temporary
            assert second == (strategy == "zero2"), peak
            assert terms["grad buckets"] == bucket * (1 + second)
            made = t["held_bytes"]
            for term, name in SAME_HELD[strategy]:
                assert made[name] == pytest.approx(terms[term], rel=0.05), (term, made)
    assert r.phases_s["memory_tracker_s"] > 0


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_deepspeed_under_fake_tensors_is_the_real_engine(strategy_results, strategy):
    """DeepSpeed's engine at N under FakeTensorMode on the fake process group (what
    memref.deepspeed_peak runs at 7B and N=256) holds what the real 2-rank run held on each rank:
    the tracker's categories at the peak and what its optimizer made at initialize, byte for
    byte; activations within 0.1% (the fake run counts 4,100 B more per micro-batch here, the size
    of its token ids and one scalar; not traced further)."""
    r = strategy_results[strategy]
    for rank, real in enumerate(r.instruments["memory"]):
        ref = memref.deepspeed_peak(r.spec, strategies.get(r.spec.strategy), rank=rank)
        assert torch.nn.functional.linear is torch._C._nn.linear  # ZeRO-3 replaced it; put back
        assert ref["total"] > 0 and ref["gradient"] > 0 and ref["activation"] > 0
        peak = real["peak_bytes"]
        for category in ("parameter", "buffer", "gradient", "optstate", "other"):
            assert ref[category] == peak[category], (rank, category, ref, peak)
        for category in ("activation", "temp", "total"):
            assert ref[category] == pytest.approx(peak[category], rel=1e-3), (rank, category, ref, peak)
        assert {k.removeprefix("held:"): v for k, v in ref.items() if k.startswith("held:")} \
            == real["held_bytes"], rank
