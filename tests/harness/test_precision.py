"""dtype bf16 as each strategy's users run it (RunSpec.precision): FSDP2 and FSDP1 gather and compute
in bf16 and reduce gradients in fp32, ZeRO-2/3 run DeepSpeed's bf16 section, DDP autocasts; the
variant autocast keeps every strategy on torch.autocast over fp32 parameters for parity studies.
Held to what the runs record: their configs, the dtype and bytes of every collective of a steady
step (the strategy table's formulas with its bf16 payloads), and the loss curve."""

import pytest
import torch

from harness import strategies, traffic
from harness.train import PROBE_PRECISION, probe_model
from tests.harness.conftest import BF16_CASES, tiny_spec
from tests.harness.test_traffic import check

# measured on the tiny model, 5 steps, ws2 (largest |loss - autocast loss| over the run), on an AMD
# EPYC host: FSDP2 0.0095, FSDP1 0.0085, ZeRO-2 0.0096, ZeRO-3 0.0095 (bf16 rounding of the
# parameters in forward; DeepSpeed also keeps bf16 gradients); DDP's autocast 6e-5 of FSDP2's (the
# same computation); fp32 0.0022 from autocast. On an Intel Xeon host, whose CPU bf16 kernels differ:
# FSDP2 0.0010, FSDP1 0.00078, ZeRO-2 0.0026, ZeRO-3 0.0025, DDP 0.00010. The bound is twice the
# largest; the native runs must also differ from autocast measurably more than DDP's autocast does
# (their bf16 parameters show): by NATIVE_APART times, 7.8x at the least here.
NATIVE_TOLERANCE = 0.02
AUTOCAST_TOLERANCE = 1e-3
NATIVE_APART = 3

# the dtype each collective carries in a native bf16 run (the payloads the row's bf16_payloads name)
DTYPES = {"ddp": {"all_reduce": "float32"},
          "fsdp": {"all_gather": "bfloat16", "reduce_scatter": "float32"},
          "fsdp1": {"all_gather": "bfloat16", "reduce_scatter": "float32"},
          "zero2": {"all_reduce": "bfloat16", "all_gather": "bfloat16"},
          "zero3": {"all_gather": "bfloat16", "reduce_scatter": "bfloat16"}}


@pytest.mark.parametrize("strategy, variant", BF16_CASES)
def test_each_strategy_runs_bf16_as_its_row_says_and_records_it(bf16_results, strategy, variant):
    r = bf16_results[(strategy, variant)]
    assert r.ok, r.describe_failure()
    precision = r.spec.precision
    assert precision == ("autocast" if strategy == "ddp" or variant == "autocast" else "native")
    said = r.strategy_config["precision"]
    if precision == "native":
        assert said == f"bf16, {strategies.get(strategy).bf16}"
    else:
        assert said.startswith("bf16 autocast")
    if strategy in ("zero2", "zero3"):
        config = r.strategy_config["deepspeed_config"]
        assert config["bf16"] == {"enabled": True} and "torch_autocast" not in config
    if strategy == "fsdp":
        assert r.strategy_config["param_dtype"] == ("bf16" if precision == "native" else "fp32")


@pytest.mark.parametrize("strategy, variant", BF16_CASES)
def test_bf16_traffic_is_the_stated_formula_in_the_stated_dtype(bf16_results, strategy, variant):
    """Bytes per op equal the row's formula with its bf16 payloads halved, and each op carries the
    dtype the strategy's mixed precision sends (the autocast variant: fp32 throughout)."""
    r = bf16_results[(strategy, variant)]
    check(r)
    dtypes = {row["op"]: row["dtype"] for row in traffic.bulk(r.traffic)}
    expected = ({op: "float32" for op in DTYPES[strategy]} if variant == "autocast" else DTYPES[strategy])
    assert {op: dtypes[op] for op in expected} == expected, r.traffic


def test_native_bf16_follows_the_autocast_loss_curve(bf16_results):
    """Every strategy's own bf16 trains the same model as FSDP2 under autocast, within the measured
    bf16 tolerance, and measurably not identically (the fp32 strategies agree to 2e-3:
    tests/harness/test_strategies.py); DDP, whose bf16 is autocast, follows it to 1e-3."""
    reference = bf16_results[("fsdp", "autocast")].losses
    assert reference[-1] < reference[0]  # it learns

    def gap(r):
        return max(abs(a - b) for a, b in zip(r.losses, reference, strict=True))

    ddp = gap(bf16_results[("ddp", "base")])
    assert ddp <= AUTOCAST_TOLERANCE
    for case, r in bf16_results.items():
        if r.spec.precision == "native":
            apart = max(NATIVE_APART * ddp, 1e-4)
            assert apart < gap(r) <= NATIVE_TOLERANCE, (case, r.losses, reference, ddp)
        else:
            assert gap(r) <= AUTOCAST_TOLERANCE, (case, r.losses, reference)


@pytest.mark.parametrize("strategy, variant, dtype, params, autocast", [
    ("fsdp", "base", "bf16", torch.bfloat16, False),    # native: FSDP's param_dtype bf16
    ("zero3", "base", "bf16", torch.bfloat16, False),   # native: DeepSpeed's bf16 section
    ("ddp", "base", "bf16", torch.float32, True),       # DDP's own bf16 is autocast
    ("fsdp", "autocast", "bf16", torch.float32, True),  # the parity variant
    ("fsdp", "base", "fp32", torch.float32, False)])
def test_the_compute_only_probe_computes_in_the_runs_precision(strategy, variant, dtype, params, autocast):
    """The probe's plain model computes as the wrapped one does: on 37c90cc it was fp32 for the four
    native strategies (their overhead went negative on a GPU, where fp32 runs at 1/15 of bf16). Its
    matmuls are observed, not assumed: the dtype an nn.Linear computes in under the probe's engine."""
    spec = tiny_spec(strategy=strategy, variant=variant, dtype=dtype)
    model = probe_model(spec, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {params}
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    from harness.parallel.engine import autocast as run_autocast

    x = torch.randint(0, spec.vocab_size, (1, 8))
    with run_autocast(spec, torch.device("cpu")):
        model(x, x)
    assert seen == [torch.bfloat16 if dtype == "bf16" else torch.float32]
    assert (spec.precision == "autocast") == autocast


def test_a_native_bf16_run_records_its_probes_precision(bf16_results):
    r = bf16_results[("fsdp", "base")]
    assert r.ok, r.describe_failure()
    assert r.strategy_config["compute_probe_precision"] == PROBE_PRECISION["native"]
    assert len(r.compute_only_step_times_s) == 1 and "step_overhead" not in r.null_reasons
