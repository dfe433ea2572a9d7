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

import json
from dataclasses import dataclass
from pathlib import Path

from harness.flops import flops_per_token, non_embedding_params
from harness.spec import RunSpec

ZERO3_CONFIG = Path(__file__).resolve().parent / "configs" / "zero3.json"
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000  # stage3_max_reuse_distance's default (DeepSpeed 0.19 config)

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


def spec_flops_per_token(spec: RunSpec) -> float:
    """Model FLOPs per token of ``spec`` from its shape alone: harness/flops.py's formula on the
    parameters harness/derive.py counts on a built model (the adapters beside the base)."""
    counts = param_counts(spec)
    adapters = adapter_params(spec) if spec.workload != "pretrain" else 0
    n_ne = non_embedding_params(n_params=counts.total + adapters, n_embd=spec.n_embd,
                                vocab_size=spec.vocab_size, block_size=spec.block_size,
                                learned_positions=spec.arch == "gpt", tied_embedding=spec.tie_embeddings)
    return flops_per_token(n_params_non_embedding=n_ne, n_layer=spec.n_layer, n_head=spec.n_head,
                           n_embd=spec.n_embd, seq_len=spec.seq_len,
                           n_trainable=adapters if spec.workload != "pretrain" else None)


def tensor_numels(spec: RunSpec) -> tuple[list[int], list[int]]:
    """(root tensors, one block's tensors): the element count of every parameter tensor of a
    pretrain model, outside the transformer blocks (embeddings, untied head, final norm: FSDP's
    root unit) and inside one block, in the model's own order."""
    d, f, v = spec.n_embd, spec.ffn_width, spec.vocab_size
    if spec.arch == "gpt":
        return [v * d, spec.block_size * d, d, d], [d, d, 3 * d * d, d * d, d, d, 4 * d * d, 4 * d * d]
    kv_dim = spec.kv_heads * (d // spec.n_head)
    attention = [d * d, d * kv_dim, d * kv_dim, d * d]
    if spec.arch == "qwen2":
        attention += [d, kv_dim, kv_dim]
    root = [v * d, d] + ([] if spec.tie_embeddings else [v * d])
    return root, [d, d] + attention + [d * f, d * f, f * d]


def payloads(spec: RunSpec, *, grad_bytes: int = 4) -> dict[str, float]:
    """Bytes of each payload the strategy table's sends name (harness/strategies.py), for a pretrain
    run with fp32 parameters (the harness's): what a formula multiplies by its counts.

        grads             P gradients at ``grad_bytes`` (2 with bf16-reduce)
        params            P parameters, 4 B each
        trainable         the same (pretrain: every parameter trains)
        blocks            the parameters inside the transformer blocks (all but FSDP's root unit)
        zero3_sharded     ZeRO-3's partitioned parameters: every tensor of more than
                          stage3_param_persistence_threshold elements (harness/configs/zero3.json)
        zero3_persistent  the others: kept whole on every rank, gathered once per step
        zero3_regathered  partitioned tensors gathered again in backward: those whose next use lies
                          more than stage3_max_reuse_distance parameters ahead in the module order
                          (DeepSpeed's PartitionedParameterCoordinator.__params_to_release)
    """
    if spec.workload != "pretrain":
        raise ValueError(f"workload {spec.workload!r}: the stated traffic formulas cover pretrain; "
                         f"lora and qlora traffic is measured only (harness/traffic.py)")
    zero = json.loads(ZERO3_CONFIG.read_text())["zero_optimization"]
    threshold = zero["stage3_param_persistence_threshold"]
    root, block = tensor_numels(spec)
    tensors = root + block * spec.n_layer
    params = sum(tensors)
    sharded_block = sum(n for n in block if n > threshold)
    # Forward runs the embedding, blocks 1..L, the final norm and the head; backward the reverse.
    # Between block k's use in forward and in backward, every later block goes by twice and the
    # final norm and head once: beyond the reuse distance its partitioned tensors are released
    # and gathered again. The embedding's reuse spans the whole model.
    if spec.arch == "gpt":
        after_blocks = root[2] + root[3] + root[0]  # final LayerNorm, tied head
    else:
        after_blocks = root[1] + root[-1]  # final norm, head (the embedding when tied)
    regathered = sum(sharded_block for k in range(1, spec.n_layer + 1)
                     if 2 * (spec.n_layer - k) * sum(block) + after_blocks >= DEEPSPEED_MAX_REUSE_DISTANCE)
    if params >= DEEPSPEED_MAX_REUSE_DISTANCE and root[0] > threshold:
        regathered += root[0]
    sharded = sum(n for n in tensors if n > threshold)
    return {"grads": grad_bytes * params, "params": 4.0 * params, "trainable": 4.0 * params,
            "blocks": 4.0 * sum(block) * spec.n_layer, "zero3_sharded": 4.0 * sharded,
            "zero3_persistent": 4.0 * (params - sharded), "zero3_regathered": 4.0 * regathered}
