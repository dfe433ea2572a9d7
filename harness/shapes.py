"""Parameter counts from a spec's shape alone (standard library only): what the memory planner
needs for models nobody built here. tests/unit/test_projection.py checks them against the
models the harness builds (harness/model.py, harness/hf.py).

    gpt            wte V x d, wpe block x d; per block two LayerNorms (weight and bias), qkv 3d^2,
                   proj d^2, MLP 8d^2 (no biases); final LayerNorm; head tied to wte
    llama/mistral  embed V x d; per block q and o d^2, k and v d x kv_dim, gate/up/down 3 d x ffn,
                   two RMSNorms; final RMSNorm; head V x d unless tied
    qwen2          as llama, plus biases on q, k and v
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.spec import RunSpec

# bitsandbytes NF4 with double quantisation: a 4-bit code per weight, an 8-bit absmax per block of
# 64 weights and an fp32 scale per 256 such blocks: 0.5 + 1/64 + 4/(64 x 256) = ~0.516 bytes
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class ParamCounts:
    total: int
    block: int  # one transformer block
    block_linear: int  # the weights of one block's linear layers (what qlora quantises)
    n_layer: int

    @property
    def linear(self) -> int:
        return self.block_linear * self.n_layer


def param_counts(spec: RunSpec) -> ParamCounts:
    d, f, v, layers = spec.n_embd, spec.ffn_width, spec.vocab_size, spec.n_layer
    if spec.arch == "gpt":
        linear = 12 * d * d
        block = linear + 4 * d
        total = v * d + spec.block_size * d + layers * block + 2 * d
        return ParamCounts(total=total, block=block, block_linear=linear, n_layer=layers)
    kv_dim = spec.kv_heads * (d // spec.n_head)
    linear = 2 * d * d + 2 * d * kv_dim + 3 * d * f
    block = linear + 2 * d + (d + 2 * kv_dim if spec.arch == "qwen2" else 0)
    total = v * d * (1 if spec.tie_embeddings else 2) + layers * block + d
    return ParamCounts(total=total, block=block, block_linear=linear, n_layer=layers)


def adapter_params(spec: RunSpec) -> int:
    """LoRA parameters: rank x (in + out) for each targeted projection of every block."""
    d, kv_dim = spec.n_embd, spec.kv_heads * (spec.n_embd // spec.n_head)
    f = spec.ffn_width
    shapes = {"q_proj": (d, d), "k_proj": (d, kv_dim), "v_proj": (d, kv_dim), "o_proj": (d, d),
              "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
    return spec.n_layer * sum(spec.lora_rank * sum(shapes[t]) for t in spec.adapter_targets if t in shapes)


def weight_bytes(spec: RunSpec) -> float:
    """Bytes of every parameter as the run stores it: fp32 (the precision policy's master weights),
    the quantised linear weights of qlora in NF4, the adapters of lora/qlora beside the base."""
    counts = param_counts(spec)
    if spec.workload == "pretrain":
        return 4.0 * counts.total
    adapters = 4.0 * adapter_params(spec)
    if spec.workload == "lora":
        return 4.0 * counts.total + adapters
    return 4.0 * (counts.total - counts.linear) + NF4_BYTES_PER_PARAM * counts.linear + adapters
