import json

import pytest

from harness.derive import (
    STRAGGLER_METRICS,
    derive_metrics,
    hardware_flops_factor,
    max_over_ranks,
    percentile,
    step_stats,
    stragglers,
)
from harness.derive_after import scaling_efficiency, with_cost, with_scaling, with_wall_time
from harness.result import BenchResult, ResultError
from harness.spec import RunSpec
from harness.transport import extract_marked, marked, write_atomic

SPEC = RunSpec(strategy="ddp", world_size=2, micro_batch=4, grad_accum=2, seq_len=128, steps=5,
               warmup_steps=1)


def measured(times=(0.5, 0.25, 0.25, 1.0), **kw):
    metrics, nulls = derive_metrics(SPEC, n_params=1_000_000, n_trainable=1_000_000, step_times_s=list(times),
                                    compute_only_step_times_s=[0.2, 0.2, 0.3], losses=[7.0, 6.5],
                                    memory_per_rank=[{"rank": 0, "peak_rss_gib": 0.5},
                                                     {"rank": 1, "peak_rss_gib": 0.75}],
                                    device_name="AMD EPYC", **kw)
    return BenchResult(spec=SPEC, status="ok", run_id="r1", step_times_s=list(times), metrics=metrics,
                       null_reasons=nulls, losses=[7.0, 6.5])


def test_original_readme_scaling_numbers_give_73_percent_not_36():
    # DDP 8,369 tok/s at 2 GPUs and 12,220 at 4 GPUs (original README): relative to
    # ws2 the efficiency is 12220 / (4/2 * 8369) = 0.730; the original printed 36.5%.
    eff = scaling_efficiency(tokens_per_s=12220, world_size=4, baseline_tokens_per_s=8369,
                             baseline_world_size=2)
    assert eff == pytest.approx(0.7301, abs=1e-4)


def test_derived_metrics_worked_by_hand():
    m = measured().metrics
    # tokens per step = 2 ranks * 4 * 2 accum * 128 = 2048; mean step = 0.5 s
    assert m["tokens_per_step"] == 2048
    assert m["step_time_mean_s"] == pytest.approx(0.5)
    assert m["tokens_per_s"] == pytest.approx(4096.0)
    assert m["tokens_per_s_per_device"] == pytest.approx(2048.0)
    assert m["step_time_median_s"] == pytest.approx(0.375)
    assert m["peak_memory_gib"] == 0.75 and m["peak_memory_kind"] == "cpu_peak_rss"
    # comm overhead = 1 - median(0.2, 0.2, 0.3) / median step 0.375
    assert m["step_overhead"] == pytest.approx(1 - 0.2 / 0.375)
    # 6N + 12LHQT with N = 1e6 - 512 positions * 128 wide; L=4, H=4, Q=32, T=128
    assert m["flops_per_token"] == pytest.approx(6 * (1_000_000 - 512 * 128) + 12 * 4 * 4 * 32 * 128)


def test_mfu_is_empty_with_a_reason_on_cpu_and_unknown_gpus():
    cpu = measured()
    assert cpu.metrics["mfu"] is None and "CPU" in cpu.null_reasons["mfu"]
    gpu_spec = SPEC.replace(device="cuda")
    m, nulls = derive_metrics(gpu_spec, n_params=10**6, n_trainable=10**6, step_times_s=[1.0],
                              compute_only_step_times_s=[],
                              losses=[], memory_per_rank=[], device_name="NVIDIA GeForce GTX 1080")
    assert m["mfu"] is None and "no peak FLOP/s known" in nulls["mfu"]
    m, _ = derive_metrics(gpu_spec, n_params=10**6, n_trainable=10**6, step_times_s=[1.0],
                              compute_only_step_times_s=[],
                          losses=[], memory_per_rank=[], device_name="NVIDIA A10")
    assert m["mfu"] == pytest.approx(m["flops_per_token"] * m["tokens_per_s_per_device"] / 125e12)


def test_step_statistics():
    stats = step_stats([4.0, 1.0, 2.0, 3.0])
    assert stats["step_time_p90_s"] == pytest.approx(3.7)  # numpy's linear method
    assert stats["step_time_min_s"] == 1.0 and stats["step_time_max_s"] == 4.0
    assert percentile([5.0], 99) == 5.0
    assert max_over_ranks([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    with pytest.raises(ValueError, match="different step counts"):
        max_over_ranks([[1.0], [1.0, 2.0]])


def test_scaling_is_never_a_default():
    result = measured()
    empty = with_scaling(result, None, "no ws1 baseline")
    assert empty.metrics["scaling_efficiency"] is None
    assert empty.null_reasons["scaling_efficiency"] == "no ws1 baseline"
    base = BenchResult(spec=SPEC.replace(world_size=1), status="ok", run_id="b",
                       metrics={"tokens_per_s": 1024.0})
    scaled = with_scaling(result, base)
    assert scaled.metrics["scaling_efficiency"] == pytest.approx(4096 / (2 * 1024))
    assert scaled.metrics["scaling_baseline_run_id"] == "b"


def test_cost_per_token():
    priced = with_cost(measured(), 1.8)  # 2 devices at $1.8/h = $0.001 per second
    assert priced.metrics["tokens_per_usd"] == pytest.approx(4096 / 0.001)
    assert priced.metrics["usd_per_million_tokens"] == pytest.approx(1e6 / (4096 / 0.001))
    assert with_cost(measured(), None).metrics["tokens_per_usd"] is None


def test_launch_overhead_is_wall_minus_timed_steps():
    result = with_wall_time(measured(), 10.0)
    assert result.metrics["launch_overhead_s"] == pytest.approx(10.0 - 2.0)
    # the compute-only probe (build + steps) is measurement, not launch cost
    probed = measured().replace(phases_s={"compute_probe_s": 1.5})
    assert with_wall_time(probed, 10.0).metrics["launch_overhead_s"] == pytest.approx(10.0 - 2.0 - 1.5)


def test_json_and_log_transport_round_trip():
    result = measured()
    assert BenchResult.loads(result.dumps()) == result
    log = "noise\n" + marked(result) + "more noise\n"
    assert extract_marked(log) == result
    assert extract_marked("nothing here") is None
    begin, payload, end = marked(result).splitlines()
    with pytest.raises(ResultError, match="truncated"):
        extract_marked(f"{begin}\n{payload[:50]}")
    with pytest.raises(ResultError, match="sha256"):
        extract_marked(f"{begin}\n{payload.replace('ddp', 'fsdp')}\n{end}\n")


def test_old_schema_is_refused_clearly():
    data = json.loads(measured().dumps())
    data["schema_version"] = 0
    with pytest.raises(ResultError, match="schema_version 0 is not supported"):
        BenchResult.from_dict(data)


def test_older_results_are_still_read_as_trial_1_without_checks():
    energy = ("energy_per_rank", "launch", "per_rank", "instruments")
    for version, missing in ((1, ("trial", "checks", "collectives", "traffic", "traffic_step", *energy)),
                             (2, ("checks", "collectives", "traffic", "traffic_step", *energy)),
                             (3, ("collectives", "traffic", "traffic_step", *energy)),
                             (4, ("traffic", "traffic_step", *energy)), (5, energy),
                             (6, ("launch", "per_rank", "instruments")), (7, ("per_rank", "instruments")),
                             (8, ("instruments",))):
        data = json.loads(measured().dumps())
        for name in missing:
            del data[name]
        data["schema_version"] = version
        old = BenchResult.from_dict(data)
        assert old.trial == (measured().trial if version >= 3 else 1)
        assert old.checks == (measured().checks if version >= 3 else {})
        assert old.traffic == [] and old.traffic_step is None and old.schema_version == 9
        assert old.energy_per_rank == (measured().energy_per_rank if version >= 6 else [])
        assert old.launch == {} and old.per_rank == [] and old.instruments == {}
        assert old.metrics == measured().metrics


def test_a_schema_8_result_keeps_its_trace_and_memory_payloads_as_instruments():
    """Schema 8 kept them in each per_rank row (``trace``, ``memory_categories``); 9 reads them as
    the instruments' per-rank payloads, and the spec's trace_steps / memory_steps (spec 5, 6) as
    the instruments asked for."""
    data = json.loads(measured().dumps())
    data["schema_version"] = 8
    data["spec"] = {k: v for k, v in data["spec"].items() if k != "instruments"}
    data["spec"].update(spec_version=6, trace_steps=2, memory_steps=1)
    rows = [{"rank": r, "node": "n", "step_times_s": [0.5], "compute_only_step_times_s": []}
            for r in range(2)]
    data["per_rank"] = [rows[0] | {"trace": {"idle_share": 0.1}, "memory_categories": {"error": "no"}},
                        rows[1] | {"trace": {"idle_share": 0.3}}]
    old = BenchResult.from_dict(data)
    assert old.per_rank == rows
    assert old.instruments == {"trace": [{"idle_share": 0.1}, {"idle_share": 0.3}],
                               "memory": [{"error": "no"}, None]}
    assert old.spec.instruments == {"trace": 2, "memory": 1}
    assert old.spec.identity() == measured().spec.identity()


def test_failure_result_invents_nothing():
    failed = BenchResult.failure(SPEC, status="oom", error="CUDA out of memory", failed_rank=1)
    assert failed.metrics == {} and failed.step_times_s == []
    assert "rank 1" in failed.describe_failure()
    with pytest.raises(ResultError, match="status"):
        BenchResult(spec=SPEC, status="weird")


def test_write_atomic_exclusive_first_writer_wins(tmp_path):
    path = tmp_path / "r.json"
    assert write_atomic(path, "first", exclusive=True)
    assert not write_atomic(path, "second", exclusive=True)
    assert path.read_text() == "first"
    write_atomic(path, "third")
    assert path.read_text() == "third"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_hfu_is_mfu_times_the_hardware_flops_factor():
    kw = dict(n_params=10**6, n_trainable=10**6, step_times_s=[1.0], compute_only_step_times_s=[], losses=[],
              memory_per_rank=[], device_name="NVIDIA A10")
    plain, _ = derive_metrics(SPEC.replace(device="cuda"), **kw)
    spec = SPEC.replace(device="cuda", variant="ac+bucket50")
    ac, _ = derive_metrics(spec, **kw)
    assert plain["hfu"] == plain["mfu"] and ac["mfu"] == plain["mfu"]
    # the factor itself is held to torch's FlopCounterMode in tests/unit/test_flops.py
    assert ac["hfu"] == pytest.approx(ac["mfu"] * hardware_flops_factor(spec, ac["flops_per_token"]))
    assert 1 < ac["hfu"] / ac["mfu"] < 4 / 3


def test_stragglers_worked_by_hand():
    """Three ranks, four probe steps; rank 2 is slowest in three of them."""
    per_rank = [[1.0, 1.0, 1.0, 1.0],
                [1.1, 1.0, 1.2, 1.0],
                [1.5, 1.2, 1.1, 1.3]]
    found, why = stragglers(per_rank)
    # per step: 1.5/1.1, 1.2/1.0, 1.2/1.1, 1.3/1.0 -> median of (1.3636, 1.2, 1.0909, 1.3)
    assert why == ""
    assert found["straggler_ratio"] == pytest.approx((1.2 + 1.3) / 2)
    assert found["straggler_ratio_max"] == pytest.approx(1.5 / 1.1)
    assert (found["slowest_rank"], found["slowest_rank_share"]) == (2, 0.75)


def test_stragglers_say_why_they_are_empty_even_when_one_ranks_probe_failed():
    one_rank = (dict.fromkeys(STRAGGLER_METRICS), "one rank: no other rank to be slower than")
    assert stragglers([[1.0, 1.0]]) == one_rank
    empty, why = stragglers([[], []])
    assert set(empty.values()) == {None} and "compute_probe_steps = 0" in why
    # rank 1's probe ran out of memory (GPU 0 carries a second pool's context): no times, no crash
    empty, why = stragglers([[1.0, 2.0], []])
    assert set(empty.values()) == {None} and why.endswith("(rank 0: 2, rank 1: 0)")
    per_rank = [{"rank": r, "node": "n", "step_times_s": [0.5], "compute_only_step_times_s": probe}
                for r, probe in enumerate(([0.2, 0.2], []))]
    metrics, nulls = derive_metrics(SPEC, n_params=1_000_000, n_trainable=1_000_000, step_times_s=[0.5],
                                    compute_only_step_times_s=[], losses=[7.0], memory_per_rank=[],
                                    device_name="cpu", per_rank=per_rank)
    assert metrics["straggler_ratio"] is None and "different compute-only probe" in nulls["straggler_ratio"]


def test_a_probe_that_failed_on_some_ranks_names_them():
    from harness.train import probe_failure

    assert probe_failure(["compute_probe_steps = 0"] * 2) == "compute_probe_steps = 0"
    oom = "compute-only probe ran out of memory (the unsharded model does not fit)"
    assert probe_failure([None, oom, None, oom]) == f"{oom} (ranks 1, 3)"
    assert probe_failure([oom, None]) == f"{oom} (rank 0)"


def test_a_result_carries_each_ranks_times_and_its_straggler_metrics():
    per_rank = [{"rank": r, "node": f"n{r}", "step_times_s": [0.5, 0.5], "compute_only_step_times_s": probe}
                for r, probe in enumerate(([0.2, 0.2], [0.4, 0.3]))]
    metrics, nulls = derive_metrics(SPEC, n_params=1_000_000, n_trainable=1_000_000,
                                    step_times_s=[0.5, 0.5], compute_only_step_times_s=[0.4, 0.3],
                                    losses=[7.0], memory_per_rank=[], device_name="cpu", per_rank=per_rank)
    assert metrics["slowest_rank"] == 1
    assert metrics["straggler_ratio"] == pytest.approx((0.4 / 0.3 + 0.3 / 0.25) / 2)
    result = BenchResult(spec=SPEC, status="ok", per_rank=per_rank, metrics=metrics, null_reasons=nulls)
    assert BenchResult.loads(result.dumps()).per_rank == per_rank
    bad = json.loads(result.dumps())
    bad["per_rank"][1]["compute_only_step_times_s"] = [0.4, "slow"]
    with pytest.raises(ResultError, match=r"per_rank\[1\].compute_only_step_times_s"):
        BenchResult.from_dict(bad)
    no_probe, nulls = derive_metrics(SPEC, n_params=1_000_000, n_trainable=1_000_000, step_times_s=[0.5],
                                     compute_only_step_times_s=[], losses=[7.0], memory_per_rank=[],
                                     device_name="cpu")
    assert no_probe["straggler_ratio"] is None and nulls["straggler_ratio"] == "no per-rank times recorded"


def test_a_failed_nccl_rank_leaves_its_group_to_the_exit(monkeypatch):
    """After a failure on NCCL the peers' collectives are pending and destroy_process_group can
    block until the 10-minute watchdog (an OOM recorded as a timeout): the failed rank leaves the
    group to its exit. A finished case, and gloo, still leave it at once."""
    import torch.distributed as dist

    from harness import rank

    left = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: left.append("destroyed"))
    for backend, failed, expect in (("nccl", True, []), ("nccl", False, ["destroyed"]),
                                    ("gloo", True, ["destroyed"]), ("cuda:nccl,cpu:gloo", True, [])):
        left.clear()
        monkeypatch.setattr(dist, "get_backend", lambda group=None, b=backend: b)
        rank._destroy_process_group(failed=failed)
        assert left == expect, (backend, failed)
