"""The step-time predictor (pytest_llmbench/planner/steptime.py) against published GPU measurements.

tests/data/published_steps.json holds the published rows with their sources, on two GPU generations
(llm-foundry's "H100 80GB BF16" and "A100 80GB" tables, torchtitan's Llama 3.1 8B FSDP rows on H100,
fms-fsdp's Llama 2 FSDP1 rows on A100 and H100 at 400 and 800 Gb/s a node); the
predictor's global parameters were fitted on them jointly (tools/fit_steptime.py) and no row, model or
device has a constant of its own. The bounds are issue 50's, per device; each source left out of the fit
in turn is docs/PLAN.md's table (tools/fit_steptime.py --cross-validate, minutes).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from harness import devices
from pytest_llmbench.planner import cli as plan_cli
from pytest_llmbench.planner import step, steptime
from pytest_llmbench.planner.validation import Validation, predict_row, spearman, validate

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "published_steps.json"
PUBLISHED = json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def validation() -> Validation:
    return validate(PUBLISHED["rows"])


def test_every_row_names_its_source_and_a_part_of_the_device_table():
    sources = PUBLISHED["sources"]
    assert len(PUBLISHED["rows"]) >= 50
    assert {r["source"] for r in PUBLISHED["rows"]} == {"llm-foundry", "llm-foundry-a100", "torchtitan",
                                                        "fms-fsdp"}
    assert {r["device"] for r in PUBLISHED["rows"]} == {"h100-sxm", "a100-80gb"}  # two generations
    for row in PUBLISHED["rows"]:
        assert row["source"] in sources and row["device"] in devices.DEVICES
        assert row["tokens_per_s_per_device"] > 0
    assert all(e["why"] for e in PUBLISHED["excluded"])  # what was left out, and why


# The rows no global value reaches (docs/PLAN.md names them): MPT-30B at its full 8192 context, one
# sequence per micro-batch on 8 GPUs, where published MFU falls from 36% to 30% (H100) and 51% to 39%
# (A100) between 4096 and 8192 while its neighbours hold (predicted 18% and 30% high); MPT-760M at
# sequence 512 on the A100, whose published MFU falls from 57% to 45% below 2048 (predicted 25% high).
OUTLIERS = {("mpt-30b", 8192), ("mpt-760m", 512)}


@pytest.mark.parametrize("device", ["h100-sxm", "a100-80gb"])
def test_predictions_hold_to_the_published_rows_of_each_device(validation, device):
    """Issue 50's bounds on each part: mean |error| <= 8%, the predicted MFU ranks the rows as the
    published MFU does (Spearman >= 0.6; a constant-MFU model scores 0), and its max of 20% on every row
    but the named outliers, which are held to the 34% this test allowed the worst of them before."""
    from pytest_llmbench.planner.validation import summarise

    rows = [r for r in validation.rows if r["device"] == device]
    mine = summarise(rows)
    assert len(rows) >= 40
    assert mine.mean_abs_error <= 0.08, mine.mean_abs_error
    assert mine.mfu_rank_correlation >= 0.6, mine.mfu_rank_correlation
    rest = [abs(r["error"]) for r in rows if (r["model"], r["seq_len"]) not in OUTLIERS]
    assert max(rest) <= 0.20, max(rest)
    assert mine.max_abs_error <= 0.34, mine.max_abs_error
    # The rows really differ in MFU: ranking them is not a tie
    published = [r["published_mfu"] for r in rows]
    assert max(published) - min(published) > 0.15


def test_a_constant_mfu_scores_zero_rank_correlation(validation):
    constant = [0.4] * len(validation.rows)
    assert spearman(constant, [r["published_mfu"] for r in validation.rows]) == 0.0
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_the_shipped_values_are_the_fit(validation):
    """FIT is a minimum of the fit's objective (mean |log error|): moving any one fitted value by 10%
    either way does not lower it, so the shipped figures are what tools/fit_steptime.py fitted."""
    rows = PUBLISHED["rows"]

    def objective(fit: steptime.Fit) -> float:
        return sum(
            abs(math.log(predict_row(r, fit).tokens_per_s_per_device / r["tokens_per_s_per_device"]))
            for r in rows
        ) / len(rows)

    best = objective(steptime.FIT)
    for name in ("gemm", "attention", "memory"):
        for factor in (0.9, 1.1):
            moved = replace(steptime.FIT, **{name: getattr(steptime.FIT, name) * factor})
            assert objective(moved) >= best - 1e-4, (name, factor)


def test_the_issue_command_prints_tokens_per_s_per_device(capsys):
    """Issue 44's command, as a user types it from the repository root, on an MPT config.json
    (tests/data/mpt-7b.json): llm-foundry published 10,643 tokens/s per GPU for this configuration."""
    command = ("--model tests/data/mpt-7b.json --device h100-sxm --world-size 8 --devices-per-node 8 "
               "--inter-node-gbps 1600 --seq-len 2048 --micro-batch 6 --grad-accum 1 --strategy fsdp "
               "--precision bf16 --time --json")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        code = plan_cli.main(command.split())
    assert code == 0
    at8 = json.loads(capsys.readouterr().out)["plans"][0]["world_sizes"]["8"]
    assert at8["estimated"] is True
    assert at8["tokens_per_s_per_device"] == pytest.approx(10643, rel=0.10)
    assert at8["step_time_s"] == pytest.approx(6 * 2048 / at8["tokens_per_s_per_device"])
    assert 0.3 < at8["mfu"] < 0.6
    assert set(at8["terms_s"]) >= {
        "compute_gemm",
        "compute_attention",
        "compute_memory",
        "optimizer",
        "exposed_communication",
    }
    assert sum(at8["terms_s"].values()) == pytest.approx(at8["step_time_s"])
    assert "total_bytes" in at8  # beside the memory figures
    # every answer carries how far such answers have been off (issue 65 item 4)
    span = at8["interval"]
    assert span["low"] < span["high"] and span["level"] == 0.98  # the 1st-99th percentiles
    assert 0 < span["coverage_on_leave_out"] <= 1 and "leave-one-source-out residuals" in span["from"]
    assert span["low"] <= 10643 <= span["high"]  # the published figure lies inside its interval


def test_the_intervals_stated_coverage_is_what_the_leave_out_residuals_give():
    """planner/leaveout.py's COVERAGE recomputed from its own residuals (each row judged by an interval
    built without its source), and one residual per published row, each from a fit without its source."""
    from pytest_llmbench.planner import interval, leaveout

    rows = json.loads((ROOT / "tests" / "data" / "published_steps.json").read_text())["rows"]
    assert len(leaveout.RESIDUALS) == len(rows)
    assert sorted(r[0] for r in leaveout.RESIDUALS) == sorted(r["source"] for r in rows)
    covered = []
    for source, device, _, value in leaveout.RESIDUALS:
        others = tuple(x for x in leaveout.RESIDUALS if x[0] != source)
        low, high = interval.bounds(others, device, leaveout.LEVEL, leaveout.MIN_ROWS)
        covered.append(low <= value <= high)
    assert sum(covered) / len(covered) == pytest.approx(leaveout.COVERAGE, abs=0.0005)
    # the span is chosen so that at least 80% of the rows left out fall inside (the 10th-90th
    # percentiles held 72%; once --time counted FSDP's bookkeeping and the A100 rows' bf16 reduction, the
    # 5th-95th held 70% and the 2.5th-97.5th 75%): a refit that drops it below must widen the span again
    assert leaveout.COVERAGE >= 0.8
    said = interval.of(1000.0, "b200")  # no published row on it: every row's residuals, said so
    assert said["rows"] == len(rows) and "fewer than 10 on this part" in said["from"]


VARIANT_COMMAND = ("--model tests/data/mpt-7b.json --device h100-sxm --world-size 16 --devices-per-node 8 "
                   "--inter-node-gbps 3200 --seq-len 4096 --micro-batch 2 --precision bf16 --time --json")


def _time(capsys, extra: str) -> tuple[int, dict | str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        code = plan_cli.main((VARIANT_COMMAND + " " + extra).split())
    out = capsys.readouterr()
    return code, json.loads(out.out)["plans"][0]["world_sizes"]["16"] if code == 0 else out.err


def test_each_recompute_policy_and_variant_is_timed_as_it_runs(capsys):
    """Issue 50's variants: the recompute term follows what each policy runs again (whole blocks >
    every second block and the op-level policy > none), HSDP adds its all-reduce across nodes, and a
    bf16 reduction halves the reduce-scatter's time."""
    got = {}
    for extra in ("--strategy fsdp", "--strategy fsdp --variant ac", "--strategy fsdp --variant ac-every2",
                  "--strategy fsdp --variant ac-op", "--strategy fsdp --variant hsdp,ac",
                  "--strategy fsdp --variant bf16-reduce", "--strategy zero3 --variant ac-op"):
        code, got[extra] = _time(capsys, extra)
        assert code == 0, got[extra]
        assert got[extra]["tokens_per_s_per_device"] > 0
    recompute = {k.rsplit(" ", 1)[-1]: v["terms_s"]["recompute"] for k, v in got.items() if "--variant" in k}
    assert got["--strategy fsdp"]["terms_s"]["recompute"] == 0
    assert recompute["ac"] == pytest.approx(2 * recompute["ac-every2"])
    assert 0 < recompute["ac-op"] < recompute["ac"]
    assert "all_reduce across nodes" in got["--strategy fsdp --variant hsdp,ac"]["communication_s"]
    plain, halved = "--strategy fsdp", "--strategy fsdp --variant bf16-reduce"
    fp32, bf16 = (got[k]["communication_s"]["reduce_scatter"] for k in (plain, halved))
    assert bf16 < 0.6 * fp32


def test_fsdp1_hybrid_shard_is_timed_though_the_harness_does_not_run_it(capsys):
    """Issue 65: `--strategy fsdp1 --variant hsdp,ac,bf16-reduce --time --json` answers, with its interval
    and the all-reduce across nodes HYBRID_SHARD adds; the harness still refuses to run the case, and says
    why (the strategy row's ``timed_only``)."""
    from harness import strategies

    code, at16 = _time(capsys, "--strategy fsdp1 --variant hsdp,ac,bf16-reduce")
    assert code == 0, at16
    assert at16["tokens_per_s_per_device"] > 0 and at16["interval"]["low"] < at16["interval"]["high"]
    assert "all_reduce across nodes" in at16["communication_s"]
    code, plain = _time(capsys, "--strategy fsdp1 --variant ac,bf16-reduce")
    assert at16["communication_s"] != plain["communication_s"]
    assert "is timed, not run" in strategies.get("fsdp1").problem("hsdp", "cuda")


@pytest.mark.parametrize(("extra", "says"), [
    ("--strategy fsdp1 --variant hsdp,ac --world-size 8", "this case runs on one node"),
    ("--strategy fsdp --variant offload", "variant offload: the predictor has no model"),
    ("--strategy ddp --variant powersgd4", "variant powersgd: the predictor has no model"),
    ("--strategy fsdp --variant ac+ac-op", "recompute policies; choose one"),
])
def test_what_the_predictor_cannot_time_is_refused_by_name(capsys, extra, says):
    code, err = _time(capsys, extra)
    assert code == 2 and says in err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--device", "x200"], "not in the device table"),
        (
            ["--device", "h100-sxm", "--world-size", "12", "--devices-per-node", "8"],
            "not a whole number of nodes",
        ),
        (["--device", "h100-sxm", "--world-size", "16"], "--inter-node-gbps"),
        ([], "--time needs --device"),
        (["--device", "a10", "--model", "tiny-mistral", "--workload", "qlora"],
         "workload qlora is not modelled"),
    ],
)
def test_bad_time_input_is_a_usage_error(extra, says, capsys):
    argv = ["--model", "gpt2-124m", "--time", "--seq-len", "128", "--activation-gib", "1"]
    code = plan_cli.main(argv + (extra if "--world-size" in extra else extra + ["--world-size", "8"]))
    assert code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('{"d_model": 64}', "no model_type"),
        ('{"model_type": "no-such-architecture"}', "transformers cannot build"),
        ("[1, 2]", "one JSON object"),
        ("{", "cannot read"),
    ],
)
def test_a_config_transformers_cannot_build_is_named(tmp_path, config, says, capsys):
    path = tmp_path / "config.json"
    path.write_text(config)
    assert plan_cli.main(["--model", str(path), "--time", "--device", "h100-sxm", "--world-size", "8"]) == 2
    err = capsys.readouterr().err
    assert says in err and str(path) in err


def test_device_without_time_is_refused(capsys):
    assert (
        plan_cli.main(
            ["--model", "gpt2-124m", "--seq-len", "128", "--device", "h100-sxm", "--activation-gib", "1"]
        )
        == 2
    )
    assert "--device is read with --time" in capsys.readouterr().err


def test_the_modelled_link_is_nccls_ring_model():
    """NCCL's tuning model (src/graph/tuning.cc) for a ring all_gather: base 8.4 us + 3.4 us a step over
    NVLink (N-1 steps) + 9.6 us a step between nodes, plus (N-1)/N x S over the bus bandwidth."""
    h100 = devices.get("h100-sxm")
    one_node = step.NcclRing(step.Network(8, None), h100)
    size = 1e9
    expected = (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * size / (450 * 0.8 * 1e9)
    assert one_node.message_s("all_gather", size, 8) == pytest.approx(expected)
    two_nodes = step.NcclRing(step.Network(8, 1600), h100)
    across = (8.4 + 14 * 3.4 + 1 * 9.6) * 1e-6 + 15 / 16 * size / (1600 / 8 * 0.8 * 1e9)
    assert two_nodes.message_s("all_gather", size, 16) == pytest.approx(across)
    assert one_node.message_s("all_reduce", size, 8) == pytest.approx(
        (8.4 + 14 * 3.4) * 1e-6 + 2 * 7 / 8 * size / (360e9)
    )
    assert one_node.message_s("all_gather", size, 1) == 0.0


def test_a_gemm_one_tile_past_a_full_wave_takes_two_waves():
    h100 = devices.get("h100-sxm")
    full = steptime.gemm_time(1, 128 * 132, 128, 4096, 0.0, h100, steptime.FIT)
    past = steptime.gemm_time(1, 128 * 133, 128, 4096, 0.0, h100, steptime.FIT)
    assert past == pytest.approx(2 * full, rel=1e-9)


def test_published_fsdp_rows_reduce_scatter_every_micro_batch():
    """Composer and torchtitan reduce-scatter after every micro-batch under full sharding, so the rows
    do (``grad_sync`` "micro_batch", the default for a published row); the harness's strategies reduce
    once a step, as their table says."""
    row = next(r for r in PUBLISHED["rows"] if r["model"] == "mpt-7b" and r["grad_accum"] > 1)
    every = predict_row(row).communication["reduce_scatter"]
    once = predict_row({**row, "grad_sync": "step"}).communication["reduce_scatter"]
    assert every == pytest.approx(row["grad_accum"] * once, rel=0.02)


@pytest.mark.parametrize(("recompute", "variant"), [
    ("none", "base"), ("full", "ac"), ("selective-op", "ac-op"), ("every2", "ac-every2"),
    ("selective-layer-3", "ac-every3")])
def test_a_published_rows_recompute_is_the_variant_that_runs_it(recompute, variant):
    from pytest_llmbench.planner.validation import row_variant

    assert row_variant({"recompute": recompute}) == variant


def test_an_unknown_recompute_in_a_row_is_named():
    from pytest_llmbench.planner.validation import row_variant

    with pytest.raises(ValueError, match="recompute 'half' is not one of none, full, selective-op"):
        row_variant({"model": "x", "recompute": "half"})


def test_a_row_reduced_in_bf16_is_timed_as_bf16_reduce():
    """llm-foundry's A100 table ran on Composer 0.15, whose DEFAULT and PURE leave FSDP1 reducing in the
    param dtype (bf16): those rows say reduce_dtype bf16 and are timed with half the reduce-scatter bytes
    and without the cast to fp32 before it; a dtype the predictor cannot time is named."""
    from pytest_llmbench.planner.validation import row_variant

    assert row_variant({"recompute": "full", "reduce_dtype": "bf16"}) == "ac+bf16-reduce"
    assert row_variant({"recompute": "none", "reduce_dtype": "bf16"}) == "bf16-reduce"
    assert row_variant({"recompute": "none", "reduce_dtype": "fp32"}) == "base"
    with pytest.raises(ValueError, match="reduce_dtype 'fp16' is not fp32 or bf16"):
        row_variant({"model": "x", "recompute": "none", "reduce_dtype": "fp16"})
    a100 = [r for r in PUBLISHED["rows"] if r["source"] == "llm-foundry-a100"]
    assert a100 and all(r["reduce_dtype"] == "bf16" for r in a100)
    assert "Composer >=0.15.0,<0.16" in PUBLISHED["sources"]["llm-foundry-a100"]
    row = a100[0]
    bf16, fp32 = predict_row(row), predict_row({**row, "reduce_dtype": "fp32"})
    assert bf16.communication["reduce_scatter"] < 0.55 * fp32.communication["reduce_scatter"]
    assert bf16.terms["bookkeeping"] < fp32.terms["bookkeeping"]


def test_zero3_time_states_deepspeeds_prefetch_and_overlap_in_its_terms():
    """`--strategy zero3 --time` says what decides its step as DeepSpeed names it, read from the config
    the harness runs (harness/configs/zero3.json), so a user can tell a run that differs."""
    from pytest_llmbench.planner import time_cli

    said = time_cli.deepspeed_facts("zero3")
    for term in ("overlap_comm true", "stage3_prefetch_bucket_size 5e+07", "reduce_bucket_size 5e+07",
                 "stage3_param_persistence_threshold 1e+05"):
        assert term in said
    assert "stage3" not in time_cli.deepspeed_facts("zero2") and time_cli.deepspeed_facts("fsdp") == ""


def _compute_s(p) -> float:
    return sum(v for k, v in p.terms.items() if k.startswith("compute_") or k == "recompute")


def test_a_slower_fabric_costs_fsdp_at_most_what_the_sm_share_bounds():
    """Issue 65's property: for an FSDP case whose communication stays under half its compute at 3200
    Gb/s a node, slowing the fabric to 400 Gb/s raises the predicted step by at most the SM share NCCL's
    channels hold over the compute (planner/contention.py), beside what the slower link leaves exposed
    (the one block nothing hides, and communication longer than the compute). Per second of link time
    the old fitted form charged 0.79 s, eight times more on the slow fabric for the same bytes."""
    from pytest_llmbench.planner import contention

    checked = 0
    for row in PUBLISHED["rows"]:
        if row["world_size"] <= row["devices_per_node"] or row["inter_node_gbps"] != 3200:
            continue
        fast, slow = predict_row(row), predict_row({**row, "inter_node_gbps": 400})
        compute, comm_fast, comm_slow = _compute_s(fast), sum(fast.communication.values()), \
            sum(slow.communication.values())
        if comm_fast >= compute / 2:
            continue
        checked += 1
        assert comm_slow > 2 * comm_fast  # the fabric is what the collectives cross
        device = devices.get(row["device"])
        share = contention.nccl_channels(device).count / device.sms
        exposed = slow.terms["exposed_communication"] - fast.terms["exposed_communication"]
        rise = slow.step_time_s - fast.step_time_s
        assert 0 < rise <= share * compute + exposed + 1e-9, (row["model"], rise, share * compute, exposed)
        # the HBM bytes are the same bytes: the slow fabric moves no more of them
        assert slow.terms["contention_hbm"] <= fast.terms["contention_hbm"] * (1 + 1e-9)
    assert checked >= 5


@pytest.mark.parametrize("part, channels", [("h100-sxm", 24), ("a100-80gb", 24), ("b200", 32), ("a10", 2)])
def test_nccl_channels_follow_its_ring_search(part, channels):
    """The channel count read from NCCL's ring search (planner/contention.py, NVIDIA/nccl 5067397): an
    H100 node's 18 NVLinks of 20.6 GB/s carry 6 channels at 60 GB/s, doubled twice; an A100's 12 of
    20.0 carry 6 at 40; a B200's 18 of 40.1 carry 8 at 90; a PCIe part one at 20, doubled once."""
    from pytest_llmbench.planner import contention

    assert contention.nccl_channels(devices.get(part)).count == channels


def test_hidden_communication_costs_what_its_units_say_not_a_fitted_rate():
    """No fitted per-second overlap cost: the Fit has no such value, and on the published rows of fast
    fabrics (NVLink nodes joined at 1600-3200 Gb/s) the contention NCCL's SM share and HBM bytes imply, per
    hidden second, lies near what Lee et al. 2025 (arXiv 2507.03114) measured on NVLink nodes (about
    0.61 s): a check, never a constant. On 400-800 Gb/s a node (fms-fsdp's rows) a hidden second moves
    fewer bytes through HBM and costs less: below every fast row's."""
    assert not hasattr(steptime.FIT, "overlap")
    fast, slow = [], []
    for row in PUBLISHED["rows"]:
        p = predict_row(row)
        hidden = min(sum(p.communication.values()), _compute_s(p))
        if hidden > 0:
            rate = (p.terms["contention_sm_share"] + p.terms["contention_hbm"]) / hidden
            (fast if row["inter_node_gbps"] >= 1600 else slow).append(rate)
    assert len(fast) + len(slow) == len(PUBLISHED["rows"]) and slow
    assert 0.3 <= min(fast) and max(fast) <= 1.2
    assert max(slow) < min(fast)


def _zero3(capsys, *extra: str) -> tuple[int, dict, str]:
    command = ("--model tests/data/mpt-7b.json --device h100-sxm --world-size 8 --seq-len 2048 "
               "--micro-batch 2 --grad-accum 16 --strategy zero3 --time").split() + list(extra)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        code = plan_cli.main(command)
    out = capsys.readouterr()
    return code, json.loads(out.out) if "--json" in extra else {}, out.out + out.err


def test_zero3_with_overlap_comm_false_exposes_every_collective(capsys):
    """DeepSpeed 0.19.8 with overlap_comm false runs ZeRO-3's parameter gathers and gradient reductions
    on the compute stream (runtime/zero/parameter_offload.py and stage3.py create their streams only when
    it is true): --overlap-comm false makes all of the step's communication exposed and none of it
    contention, and --time states the setting in DeepSpeed's terms; FSDP refuses the flag by name."""
    code, hidden, _ = _zero3(capsys, "--json")
    assert code == 0
    code, exposed, _ = _zero3(capsys, "--json", "--overlap-comm", "false")
    assert code == 0
    on, off = (doc["plans"][0]["world_sizes"]["8"] for doc in (hidden, exposed))
    communication = sum(off["communication_s"].values())
    assert off["terms_s"]["exposed_communication"] == pytest.approx(communication)
    assert off["terms_s"]["contention_sm_share"] == 0 and off["terms_s"]["contention_hbm"] == 0
    assert on["terms_s"]["exposed_communication"] < 0.1 * communication  # overlapped: little left exposed
    assert off["step_time_s"] > on["step_time_s"]
    code, _, said = _zero3(capsys, "--overlap-comm", "false")
    assert code == 0
    assert "overlap_comm false (--overlap-comm) (its gathers and reductions run on the compute stream" in said
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        code = plan_cli.main("--model tests/data/mpt-7b.json --device h100-sxm --world-size 8 --seq-len 2048 "
                             "--micro-batch 2 --strategy fsdp --time --overlap-comm false".split())
    assert code == 2
    assert "--overlap-comm false: DeepSpeed's setting (its ZeRO strategies); --strategy fsdp" in \
        capsys.readouterr().err


_COMMAND = ("--model tests/data/mpt-7b.json --device h100-sxm --world-size 8 --seq-len 2048 --micro-batch 2 "
            "--grad-accum 4 --time --json").split()


def _fsdp(capsys, strategy: str, *extra: str) -> tuple[int, dict, str]:
    command = [*_COMMAND, "--strategy", strategy, *extra]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        code = plan_cli.main(command)
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else {}, out.err


def test_time_charges_each_strategys_bookkeeping_bytes_at_hbm_rate(capsys):
    """--time times the bytes FSDP's own code moves (harness/bookkeeping.py, each term held to a measured
    CPU step by tests/harness/test_bookkeeping.py) at the memory-bound rate: the term is those bytes over
    HBM x FIT.memory; DDP's C++ reducer copies each gradient into its bucket and back, and under
    no_sync every rank accumulates the full gradients. Reduced every micro-batch
    (--grad-sync micro-batch, as Composer and torchtitan run FSDP), FSDP1 casts and divides the whole
    gradient each micro-batch: more bytes than once a step."""
    from harness import bookkeeping, strategies
    from harness.spec import RunSpec  # noqa: F401 (the spec --time builds)
    from pytest_llmbench.planner import configs

    device = devices.get("h100-sxm")
    seconds = {}
    for strategy, extra in (("fsdp1", ()), ("fsdp1", ("--grad-sync", "micro-batch")), ("fsdp", ()),
                            ("ddp", ())):
        code, doc, err = _fsdp(capsys, strategy, *extra)
        assert code == 0, err
        at8 = doc["plans"][0]["world_sizes"]["8"]
        seconds[(strategy, extra)] = at8["terms_s"]["bookkeeping"]
        assert at8["step_time_s"] == pytest.approx(sum(at8["terms_s"].values()))
    assert strategies.get("ddp").bookkeeping == "ddp_reducer"
    once, every = seconds[("fsdp1", ())], seconds[("fsdp1", ("--grad-sync", "micro-batch"))]
    assert 0 < once < every
    # the same seconds from harness/bookkeeping.py's terms, by hand: P elements, p 2 (bf16), r 4 (fp32)
    config = json.loads((ROOT / "tests" / "data" / "mpt-7b.json").read_text())
    spec = configs.spec_of_config(config, "mpt-7b", seq_len=2048, micro_batch=2, strategy="fsdp1",
                                  dtype="bf16", world_size=8)
    params = configs.operator_profile(config, spec, micro_batch=2, seq_len=2048).params
    s = bookkeeping.Sizes(n=8, m=4, params=params, gathered=2 * 4 * params, reduced=params, p=2, r=4)
    rate = device.hbm_gbps * 1e9 * steptime.FIT.memory
    pre, post = bookkeeping.predivide(8)
    assert (pre, post) == (4.0, 2.0)
    by_hand = (6 * params / 8 * 2 * 4  # the fp32 shard cast to bf16 each gather: fwd, bwd, 4 micro-batches
               + 4 * params * 4 + 6 * params * 3  # views' gradients concatenated, then accumulated (no_sync)
               + 6 * params + 8 * params + 8 * params / 8  # cast to fp32, pre- and post-divide, once
               + 12 * params / 8)  # clip: the shards' norm and scaling
    assert bookkeeping.total("flat_param", s) == pytest.approx(by_hand)
    assert once == pytest.approx(by_hand / rate, rel=0.02)
    # DDP: bf16 is autocast over fp32 weights, so fp32 gradients (g 4): into the buckets divided, back out,
    # and three micro-batches added into the full gradients under no_sync
    ddp = bookkeeping.Sizes(n=8, m=4, params=params, gathered=0, reduced=0, p=4, r=4)
    assert bookkeeping.total("ddp_reducer", ddp) == pytest.approx(8 * params + 8 * params + 12 * params * 3)
    assert seconds[("ddp", ())] == pytest.approx(52 * params / rate, rel=0.02)


def test_grad_sync_micro_batch_is_fsdps_and_refused_for_others_by_name(capsys):
    code, _, err = _fsdp(capsys, "zero2", "--grad-sync", "micro-batch")
    assert code == 2
    assert "--grad-sync micro-batch: FSDP's choice (--strategy fsdp or fsdp1); --strategy zero2" in err
    with pytest.raises(SystemExit) as exc:
        _fsdp(capsys, "fsdp", "--grad-sync", "every")
    assert exc.value.code == 2
    assert "argument --grad-sync: invalid choice: 'every'" in capsys.readouterr().err


def test_the_intervals_percentiles_are_said_as_ordinals():
    from pytest_llmbench.planner.time_cli import ordinal

    assert [ordinal(x) for x in (1, 2, 3, 4, 2.5, 11, 12, 13, 21, 99, 97.5)] == [
        "1st", "2nd", "3rd", "4th", "2.5th", "11th", "12th", "13th", "21st", "99th", "97.5th"]


def test_a_row_without_a_bookkeeping_rule_is_timed_with_none_and_says_so(capsys, monkeypatch):
    """A plugin row that names no rule of harness/bookkeeping.py: --time charges no bookkeeping and says
    that it is not stated, in the table's notes and in --json's ``not_stated``; a built-in row says
    nothing of the kind."""
    import dataclasses

    from harness import strategies

    monkeypatch.setattr(strategies, "_TABLE", dict(strategies._TABLE))  # the row leaves with the test
    strategies.register(dataclasses.replace(strategies.get("ddp"), name="ddp-unstated", bookkeeping=""))
    code, doc, err = _fsdp(capsys, "ddp-unstated")
    assert code == 0, err
    at8 = doc["plans"][0]["world_sizes"]["8"]
    assert at8["terms_s"]["bookkeeping"] == 0
    assert at8["not_stated"] == ["ddp-unstated --variant base: the bytes its own code moves "
                                 "(harness/bookkeeping.py) are not stated, and none are timed"]
    assert "not_stated" not in _fsdp(capsys, "ddp")[1]["plans"][0]["world_sizes"]["8"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        assert plan_cli.main([a for a in _COMMAND if a != "--json"] + ["--strategy", "ddp-unstated"]) == 0
    said = capsys.readouterr().out
    assert "  (not stated: ddp-unstated --variant base: the bytes its own code moves" in said


def test_a_hybrid_sharded_row_is_timed_as_hsdp():
    """fms-fsdp's 7B rows ran FSDP1 under HYBRID_SHARD (sharded in the 8-GPU node, replicated across
    nodes): timed as the variant hsdp, whose gradients cross the nodes as an all-reduce of the node's
    shard; a sharding the predictor cannot time is named."""
    from pytest_llmbench.planner.validation import row_variant

    assert row_variant({"recompute": "none", "sharding": "HYBRID_SHARD"}) == "hsdp"
    assert row_variant({"recompute": "none", "sharding": "FULL_SHARD"}) == "base"
    with pytest.raises(ValueError, match="sharding 'SHARD_GRAD_OP' is not FULL_SHARD or HYBRID_SHARD"):
        row_variant({"model": "x", "recompute": "none", "sharding": "SHARD_GRAD_OP"})
    hybrid = [r for r in PUBLISHED["rows"] if r.get("sharding") == "HYBRID_SHARD"]
    assert {(r["source"], r["model"]) for r in hybrid} == {("fms-fsdp", "llama2-7b")}
    row = hybrid[0]
    hsdp, full = predict_row(row), predict_row({**row, "sharding": "FULL_SHARD"})
    assert "all_reduce across nodes" in hsdp.communication
    assert not any(op.startswith("all_reduce") for op in full.communication)
