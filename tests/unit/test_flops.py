import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from harness.flops import flops_per_token, mfu, non_embedding_params, peak_flops
from harness.model import build_model
from harness.spec import RunSpec


@pytest.mark.parametrize("preset, seq_len", [("tiny", 64), ("tiny", 256)])
def test_formula_matches_flop_counter_on_the_models_matmuls(preset, seq_len):
    spec = RunSpec.from_preset(preset, seq_len=seq_len, micro_batch=2)
    model = build_model(spec)
    idx = torch.randint(0, spec.vocab_size, (spec.micro_batch, seq_len))
    # The math SDPA backend runs attention as plain matmuls, which the counter sees (it has
    # no formula for the fused CPU kernel). It computes the full T x T scores, as 12LHQT assumes.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    counted_per_token = counter.get_total_flops() / (spec.micro_batch * seq_len)
    n_params = model.num_params()
    formula = flops_per_token(
        n_params_non_embedding=non_embedding_params(n_params=n_params, block_size=spec.block_size,
                                                    n_embd=spec.n_embd),
        n_layer=spec.n_layer, n_head=spec.n_head, n_embd=spec.n_embd, seq_len=seq_len)
    # The counter sees matmuls only; 6N also counts LayerNorm weights (not matmuls).
    ln_params = sum(p.numel() for n, p in model.named_parameters() if "ln" in n)
    assert counted_per_token == pytest.approx(formula - 6 * ln_params, rel=1e-9)
    assert counted_per_token == pytest.approx(formula, rel=0.01)


def test_gpt2_124m_flops_per_token():
    # N = 124,337,664 params incl. tied wte, minus 1024 * 768 positions = 123,551,232
    n = 124_337_664 - 1024 * 768
    fpt = flops_per_token(n_params_non_embedding=n, n_layer=12, n_head=12, n_embd=768, seq_len=1024)
    assert fpt == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 1024)
    assert fpt == pytest.approx(0.8547e9, rel=1e-3)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA A10", 125e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12),
    ("NVIDIA L40S", 362e12),
])
def test_peak_table(name, peak):
    assert peak_flops(name)[0] == peak


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X"])
def test_unknown_devices_get_no_guess(name):
    value, reason = peak_flops(name)
    assert value is None and name in reason


def test_mfu_worked_example():
    # the original README's A10 ZeRO-2 4-GPU number: 18,147 tok/s over 4 GPUs at 0.93 GFLOP/token
    assert mfu(flops_per_token=0.93e9, tokens_per_s_per_device=18147 / 4,
               peak_flops_per_s=125e12) == pytest.approx(0.0338, abs=1e-4)
