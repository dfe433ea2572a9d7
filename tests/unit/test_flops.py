import bitsandbytes as bnb
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from harness.flops import flops_per_token, mfu, non_embedding_params, peak_flops
from harness.model import build_model
from harness.spec import RunSpec

CPU = torch.device("cpu")


def counted_and_formula(spec: RunSpec, backend=SDPBackend.MATH):
    """(model, FLOPs per token FlopCounterMode saw in one forward + backward, the formula's)."""
    model = build_model(spec, CPU)
    idx = torch.randint(0, spec.vocab_size, (spec.micro_batch, spec.seq_len))
    # The math SDPA backend runs attention as plain matmuls, which the counter sees (it has
    # no formula for the fused CPU kernel). It computes the full T x T scores, as 12LHQT assumes.
    with sdpa_kernel(backend), FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    counted = counter.get_total_flops() / (spec.micro_batch * spec.seq_len)
    n_ne = non_embedding_params(n_params=model.n_params, n_embd=spec.n_embd, vocab_size=spec.vocab_size,
                                block_size=spec.block_size, learned_positions=spec.arch == "gpt",
                                tied_embedding=spec.tie_embeddings)
    formula = flops_per_token(n_params_non_embedding=n_ne, n_layer=spec.n_layer, n_head=spec.n_head,
                              n_embd=spec.n_embd, seq_len=spec.seq_len,
                              n_trainable=model.n_trainable if spec.workload != "pretrain" else None)
    return model, counted, formula


def vectors(model) -> int:
    """Norm weights and biases: in N (6N counts every parameter), but no matmul for the counter."""
    return sum(p.numel() for p in model.parameters() if p.dim() == 1)


@pytest.mark.parametrize("preset, seq_len", [("tiny", 64), ("tiny", 256), ("tiny-llama", 64),
                                             ("tiny-mistral", 128), ("tiny-qwen2", 64)])
def test_formula_matches_flop_counter_on_the_models_matmuls(preset, seq_len):
    """GPT, and the Hugging Face shapes: grouped-query attention, SwiGLU, untied (llama, mistral)
    and tied (qwen2) heads, qwen2's q/k/v biases: 6N + 12LHQT from the model's own parameters."""
    spec = RunSpec.from_preset(preset, seq_len=seq_len, micro_batch=2)
    model, counted, formula = counted_and_formula(spec)
    assert counted == pytest.approx(formula - 6 * vectors(model), rel=1e-9)
    assert counted == pytest.approx(formula, rel=0.01)


@pytest.mark.parametrize("workload", ["lora", "qlora"])
def test_frozen_weight_convention_against_the_counter(workload):
    """4 N_frozen + 6 N_trainable + 12LHQT. The counter sees one thing the convention does not
    model: autograd computes no input gradient where nothing upstream needs one, and the first
    layer's q, k, v projections (base weight and lora_A) read the frozen embedding's output.
    Under qlora it misses one thing the device does: bitsandbytes' 4-bit forward matmul is its
    own kernel, which FlopCounterMode has no formula for (2 FLOPs per quantised weight)."""
    spec = RunSpec.from_preset("tiny-mistral", seq_len=64, micro_batch=2, workload=workload, lora_rank=4)
    model, counted, formula = counted_and_formula(spec)
    attn = model.blocks[0].self_attn
    qkv = [getattr(attn, name) for name in ("q_proj", "k_proj", "v_proj")]
    first = sum(m.in_features * m.out_features + m.lora_A["default"].weight.numel() for m in qkv)
    frozen_vectors = sum(p.numel() for p in model.parameters() if p.dim() == 1 and not p.requires_grad)
    quantised = sum(m.in_features * m.out_features for m in model.modules()
                    if isinstance(m, bnb.nn.Linear4bit))
    assert (quantised > 0) == (workload == "qlora")
    assert counted == pytest.approx(formula - 2 * first - 4 * frozen_vectors - 2 * quantised, rel=1e-9)
    assert model.n_trainable == 2 * 4 * (4 * 128 + 2 * (128 + 64))  # r (in + out) per q,k,v,o, 2 layers


def test_gpt2_124m_flops_per_token():
    # N = 124,337,664 params incl. tied wte, minus 1024 * 768 positions = 123,551,232
    n = 124_337_664 - 1024 * 768
    fpt = flops_per_token(n_params_non_embedding=n, n_layer=12, n_head=12, n_embd=768, seq_len=1024)
    assert fpt == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 1024)
    assert fpt == pytest.approx(0.8547e9, rel=1e-3)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA A10", 125e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA H100 80GB HBM3", 989.4e12),
    ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835.5e12), ("NVIDIA H200", 989.4e12),
    ("NVIDIA H200 NVL", 835.5e12),  # half the datasheet's 1,671 TFLOPS "with sparsity"
    ("NVIDIA L40S", 362.05e12),
])
def test_peak_table(name, peak):
    """Each part's dense bf16 peak as its datasheet gives it, read from the one device table
    (harness/devices.py) by the name its driver reports."""
    assert peak_flops(name)[0] == pytest.approx(peak)


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090", "AMD Instinct MI250X"])
def test_unknown_devices_get_no_guess(name):
    value, reason = peak_flops(name)
    assert value is None and name in reason


def test_mfu_worked_example():
    # the original README's A10 ZeRO-2 4-GPU number: 18,147 tok/s over 4 GPUs at 0.93 GFLOP/token
    assert mfu(flops_per_token=0.93e9, tokens_per_s_per_device=18147 / 4,
               peak_flops_per_s=125e12) == pytest.approx(0.0338, abs=1e-4)


@pytest.mark.parametrize("preset, seq_len, workload, variant", [
    ("tiny", 64, "pretrain", "ac"), ("tiny", 256, "pretrain", "ac"), ("tiny-llama", 128, "pretrain", "ac"),
    ("tiny-mistral", 64, "lora", "ac"), ("tiny", 64, "pretrain", "ac-every2"),
    ("tiny-llama", 64, "pretrain", "ac-every2"), ("tiny", 64, "pretrain", "ac-op"),
    ("tiny-llama", 64, "pretrain", "ac-op"), ("tiny-qwen2", 64, "pretrain", "ac-op")])
def test_the_hardware_flops_factor_is_what_the_counter_sees_recomputed(preset, seq_len, workload, variant):
    """HFU / MFU under each recompute policy: FlopCounterMode counts what a real backward
    recomputes, and its ratio to the plain run is the factor. Not the 4/3 of a full extra forward
    it once was: the head is not recomputed, and torch's non-reentrant checkpoint stops before
    each block's last linear layer (1.20 for tiny at seq 64, where 4/3 overstated HFU by 11%).
    ac-op runs attention as the fused kernel it saves (the default backend: the counter has no formula
    for the CPU kernel, so attention counts 0 in both runs); qwen2's biased q/k/v run as addmm, which
    torchtitan's policy recomputes."""
    from harness.derive import hardware_flops_factor
    from harness.recompute import Recompute, apply

    spec = RunSpec.from_preset(preset, seq_len=seq_len, micro_batch=2, workload=workload, variant=variant)
    backend = SDPBackend.FLASH_ATTENTION if variant == "ac-op" else SDPBackend.MATH
    model, plain, formula = counted_and_formula(spec.replace(variant="base"), backend)
    torch.manual_seed(0)
    checkpointed = build_model(spec, CPU)
    apply(checkpointed, Recompute.of(spec.variant_parts()))
    idx = torch.randint(0, spec.vocab_size, (spec.micro_batch, spec.seq_len))
    with sdpa_kernel(backend), FlopCounterMode(display=False) as counter:
        checkpointed(idx, idx).backward()
    recomputed = counter.get_total_flops() / (spec.micro_batch * spec.seq_len) - plain
    assert recomputed > 0
    assert 1 + recomputed / formula == pytest.approx(hardware_flops_factor(spec, formula), rel=0.005)
    assert abs(hardware_flops_factor(spec, formula) - 4 / 3) > 0.02
