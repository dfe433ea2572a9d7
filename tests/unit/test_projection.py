"""The projection, the overhead split, strong scaling's batch split and the memory planner, on
cases worked by hand (pytest_llmbench/planner/projection.py is pure: no torch)."""

import pytest

from harness import strategies
from harness.bandwidth import ring_steps
from harness.derive_after import overhead_split
from harness.shapes import adapter_params, param_counts, weight_bytes
from harness.spec import RunSpec, SpecError
from pytest_llmbench.cases import Case, batch_split, make_spec
from pytest_llmbench.planner import projection
from pytest_llmbench.planner.projection import (
    Group,
    MemoryCase,
    Point,
    fit_activations,
    group_comm_s,
    op_scale,
    project,
)
from pytest_llmbench.planner.step import Bandwidth
from pytest_llmbench.profiles import load_profiles, parse_profile

LINK = Bandwidth("declared (100 GB/s)", declared_gbps=100.0)


def message(op: str, size: float, count: int = 1) -> dict:
    return {"op": op, "group_size": 2, "dtype": "float32", "bytes": size, "count": count}


def group(strategy="ddp", *, trainable=250_000_000, points=None, **kw) -> Group:
    """DDP's measured step: one all_reduce of 1 GB of fp32 gradients; a baseline of 1.0 s compute and
    0.1 s wrapper at ws1."""
    base = Point(1, step_s=1.1, compute_s=1.0, tokens_per_step=4096, grad_accum=1)
    kw.setdefault("traffic", [message("all_reduce", 4 * trainable)])
    return Group(label=strategy, strategy=strategy, variant_parts=frozenset(), points=points or [base],
                 seq_len=128, row=strategies.get(strategy), **kw)


def test_a_ring_all_reduce_of_1_gb_at_100_gbps_on_8_ranks():
    assert group_comm_s(group(), 8, 1, LINK) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)  # 17.5 ms
    assert group_comm_s(group(), 1, 1, LINK) == 0.0  # one rank sends nothing


def test_a_probed_message_is_the_probe_at_its_own_size_and_n_and_carried_by_ring_laws():
    """1 KB all_reduce at 0.001 GB/s busbw on 2 ranks: t = 1e3 x 1 / 1e6 = 1 ms (the latency); 1 MB at
    1 GB/s: 1 ms, of which 1 ms - latency is bandwidth. At 8 ranks the latency part grows with the
    ring's 2(n-1) steps (x7), the bandwidth part with the bus factor (1.75 / 1)."""
    link = Bandwidth("measured", rows={"all_reduce": [(1000, 0.001), (1_000_000, 1.0)]}, world_size=2)
    assert link.message_s("all_reduce", 1000, 2) == pytest.approx(1e-3)
    assert link.message_s("all_reduce", 1_000_000, 2) == pytest.approx(1e-3)  # the probe, size by size
    assert link.message_s("all_reduce", 1000, 8) == pytest.approx(7e-3)  # latency x 14/2
    big = 10_000_000  # beyond the sweep: the largest size's busbw, 10 ms at ws2
    assert link.message_s("all_reduce", big, 8) == pytest.approx(7e-3 + (10e-3 - 1e-3) * 1.75)
    assert ring_steps("all_gather", 8) == 7 and ring_steps("all_reduce", 8) == 14


def test_strong_scaling_counts_follow_the_formula_per_op():
    """FSDP reduce-scatters once per step under no_sync, ZeRO-3 every micro-batch; ZeRO-3's
    persistent tensors are gathered once per step, its partitioned ones every micro-batch."""
    payloads = dict.fromkeys(("grads", "params", "trainable", "blocks"), 100.0) | {
        "zero3_sharded": 80.0, "zero3_persistent": 20.0, "zero3_regathered": 0.0}
    fsdp = group("fsdp", traffic_micro_batches=2, payloads=payloads)
    assert op_scale(fsdp, 4) == {"all_gather": 2.0, "reduce_scatter": 1.0}
    zero3 = group("zero3", traffic_micro_batches=1, payloads=payloads)
    assert op_scale(zero3, 3) == pytest.approx({"all_gather": (3 * 80 + 20) / 100, "reduce_scatter": 3.0})
    unsized = Group(**{**vars(zero3), "payloads": None})  # lora/qlora: per micro-batch, an upper bound
    assert op_scale(unsized, 3) == {"all_gather": 3.0, "reduce_scatter": 3.0}
    assert op_scale(zero3, 1) == {}


def test_measured_bandwidth_is_interpolated_on_a_log_size_axis():
    link = Bandwidth("measured", rows={"all_reduce": [(1000, 1.0), (100_000, 3.0)]})
    assert link.busbw_gbps("all_reduce", 10_000) == pytest.approx(2.0)
    assert link.busbw_gbps("all_reduce", 10) == 1.0 and link.busbw_gbps("all_reduce", 1e9) == 3.0


def test_projection_from_a_baseline_alone_assumes_nothing_hidden():
    out = project(group(usd_per_device_hour=3.6), [8], lambda n: LINK)
    by_n = {r.world_size: r for r in out.rows}
    assert by_n[8].step_s == pytest.approx(1.0 + 0.1 + 0.0175)  # compute + wrapper + all of comm
    assert by_n[8].weak_efficiency == pytest.approx(1.1 / 1.1175)
    assert by_n[8].exposed_comm_share == pytest.approx(0.0175 / 1.1175)
    assert by_n[8].tokens_per_s == pytest.approx(8 * 4096 / 1.1175)
    assert by_n[8].usd_per_million_tokens == pytest.approx(3.6 * 8 / 3600 / by_n[8].tokens_per_s * 1e6)
    assert by_n[1].measured_step_s == 1.1 and by_n[8].measured_step_s is None
    assert out.validation == [] and "assumed 0" in out.notes[0]


def test_overlap_is_fitted_and_each_measured_size_is_predicted_without_itself():
    # 100 GB of gradients at 100 GB/s: comm 1.0 s at ws2, 1.5 s at ws4; a quarter of the 1.0 s compute
    # hides communication, so exposed is 0.75 and 1.25 s
    base = Point(1, 1.1, 1.0, 4096, 1)
    points = [base, Point(2, 1.1 + 0.75, 1.0, 8192, 1), Point(4, 1.1 + 1.25, 1.0, 16384, 1)]
    out = project(group(trainable=25_000_000_000, points=points), [8], lambda n: LINK)
    assert [(v.world_size, v.fitted_on) for v in out.validation] == [(2, "ws1, ws4"), (4, "ws1, ws2")]
    assert all(v.error == pytest.approx(0, abs=1e-12) for v in out.validation)
    ws8 = next(r for r in out.rows if r.world_size == 8)
    assert ws8.step_s == pytest.approx(1.1 + 2 * 7 / 8 - 0.25)


def test_the_overlap_fit_reproduces_its_point_and_reads_noise_as_nothing_exposed():
    """The fit and the step use the same compute at N (N's own compute-only probe where N was run,
    else the baseline's), so the model returns the step it was fitted on (it once fitted with N's
    compute and projected with N0's: 0.3628 s measured, 0.3118 s projected). A step measured below
    compute + wrapper (noise) is 0 exposed: all of comm hidden, never more (it once fitted 0.093
    where 0.015 was right)."""
    base = Point(1, 1.1, 1.0, 4096, 1)
    ws2 = Point(2, 1.1 + 0.75, 1.2, 8192, 1)  # its own compute-only probe read 1.2 s
    model = projection.Model(group(trainable=25_000_000_000, points=[base, ws2]), lambda n: LINK)
    overlap = model.overlap_from([ws2])
    assert overlap == pytest.approx((1.0 - (1.85 - 1.2 - 0.1)) / 1.2)  # comm 1 s, 0.55 s of it exposed
    assert model.step(2, 4096, overlap)[0] == pytest.approx(ws2.step_s)
    assert model.compute(8, 4096) == 1.0 and model.compute(2, 2048) == pytest.approx(0.6)  # per token
    fast = Point(2, 1.0, 1.0, 8192, 1)  # 0.1 s below compute + wrapper
    noisy = projection.Model(group(trainable=25_000_000_000, points=[base, fast]), lambda n: LINK)
    assert noisy.overlap_from([fast]) == pytest.approx(1.0)  # comm 1 s, all of it under 1 s of compute
    small = projection.Model(group(trainable=250_000_000, points=[base, fast]), lambda n: LINK)
    assert small.overlap_from([fast]) == pytest.approx(0.01)  # comm 10 ms hidden: 0.01 of compute


def test_a_group_without_measured_traffic_is_not_projected_and_says_why():
    out = project(group(traffic=[]), [8], lambda n: LINK)
    assert out.rows == [] and "no measured traffic" in out.notes[0]


def test_strong_scaling_splits_the_global_batch():
    out = project(group(), [2, 4], lambda n: LINK)  # global batch: the baseline's 4096 tokens
    by_n = {r.world_size: r for r in out.rows}
    # ws4: 1024 tokens per rank, a quarter of the compute; comm is the same 1 GB all-reduce
    step4 = 0.25 + 0.1 + 2 * 3 / 4 * 1e9 / 100e9
    assert by_n[4].strong_step_s == pytest.approx(step4)
    assert by_n[4].strong_efficiency == pytest.approx(1.1 / (4 * step4))
    far = project(group(), [64], lambda n: LINK).rows[-1]  # 64 tokens per rank < one sequence of 128
    assert far.world_size == 64 and far.strong_step_s is None and far.strong_efficiency is None


def test_no_link_across_nodes_stops_the_projection_and_says_why():
    out = project(group(), [8, 16], lambda n: LINK if n <= 8 else None)
    assert [r.world_size for r in out.rows] == [1, 8]
    assert "no bandwidth for ws16" in out.notes[-1]


def test_unmodelled_variants_and_missing_baselines_are_not_projected():
    offload = Group(**{**vars(group("zero3")), "variant_parts": frozenset({"offload"})})
    assert project(offload, [8], lambda n: LINK).rows == []
    nobase = group(points=[Point(2, 1.0, 0.9, 8192, 1)])
    assert "no measured ws1 baseline" in project(nobase, [8], lambda n: LINK).notes[0]


def test_the_overhead_split_worked_by_hand():
    split = overhead_split(step_s=1.0, compute_s=0.7, base_step_s=0.8, base_compute_s=0.75)
    assert split["wrapper_overhead_s"] == pytest.approx(0.05)
    assert split["exposed_comm_s"] == pytest.approx(0.25)  # 0.3 over the bare model, 0.05 of it the wrapper's
    assert (split["wrapper_overhead"], split["exposed_comm"]) == pytest.approx((0.05, 0.25))
    at_n0 = overhead_split(step_s=0.8, compute_s=0.75, base_step_s=0.8, base_compute_s=0.75)
    assert at_n0["exposed_comm_s"] == 0


def test_activation_fit():
    cases = [MemoryCase("c", 1, state=1000.0, units=u, peak=1000.0 + 100 + 2 * u) for u in (10, 20, 40)]
    fit = fit_activations(cases, runtime_counted=False)
    assert (fit.intercept, fit.per_unit) == pytest.approx((100, 2))
    assert all(e == pytest.approx(0, abs=1e-12) for _, _, e in fit.errors)
    one = [MemoryCase("c", 1, 1000.0, 10, 1500.0)]
    assert fit_activations(one, runtime_counted=True).intercept == 500  # CPU: the runtime's
    assert fit_activations(one, runtime_counted=False).per_unit == 50  # GPU: all activations


def test_parameter_counts_match_the_built_models():
    import torch

    from harness.model import build_model

    for name in ("tiny", "tiny-llama", "tiny-mistral", "tiny-qwen2"):
        spec = RunSpec.from_preset(name, seq_len=64)
        assert param_counts(spec).total == build_model(spec, torch.device("cpu")).n_params, name
    lora = RunSpec.from_preset("tiny-mistral", seq_len=64, workload="lora")
    assert adapter_params(lora) == build_model(lora, torch.device("cpu")).n_trainable == 28_672
    # the published sizes: Llama-2-7B, Mistral-7B, Llama-3-8B
    assert [param_counts(RunSpec.from_preset(m)).total for m in ("llama2-7b", "mistral-7b", "llama3-8b")] == [
        6_738_415_616, 7_241_732_096, 8_030_261_248]
    qlora = RunSpec.from_preset("mistral-7b", workload="qlora")
    assert weight_bytes(qlora) < 0.25 * weight_bytes(qlora.replace(workload="pretrain"))


def test_strong_scaling_splits_the_profiles_global_batch(tmp_path):
    base = dict(device="cpu", dtype="fp32", model="tiny", micro_batch=8, grad_accum=1, steps=4,
                warmup_steps=1,
                strategies=["ddp"], world_sizes=[1, 2, 8], seq_lens=[128], scaling="strong",
                global_batch_tokens=4096)
    profile = parse_profile("strong", base, source="strong.toml")
    assert [batch_split(profile, n, 128) for n in (1, 2, 4, 8)] == [(8, 4), (8, 2), (8, 1), (4, 1)]
    with pytest.raises(SpecError, match=r"global_batch_tokens = 4096 \(profile strong.toml\): its 32 "
                                        r"sequences "
                                        r"of 128 tokens do not split evenly over world_size 3"):
        batch_split(profile, 3, 128)
    with pytest.raises(SpecError, match="is not a whole number of sequences of seq_len 100"):
        batch_split(profile, 1, 100)
    one, two = (make_spec(profile, "ddp", n, 128) for n in (1, 2))
    assert one.scaling == "strong" and one.tokens_per_step == two.tokens_per_step == 4096
    assert Case(profile, one).group == Case(profile, two).group  # the same baseline group
    assert load_profiles()["cpu"].scaling == "weak"
