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

from harness import strategies
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
    """Totals of ``tensor_numels``: every parameter, one block, one block's linear weights."""
    block = block_tensors(spec)
    return ParamCounts(total=sum(tensor_numels(spec)[0]) + spec.n_layer * sum(n for n, _ in block),
                       block=sum(n for n, _ in block), block_linear=sum(n for n, linear in block if linear),
                       n_layer=spec.n_layer)


def projection_dims(spec: RunSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection a LoRA adapter can target (llama-family names)."""
    d, f = spec.n_embd, spec.ffn_width
    kv_dim = spec.kv_heads * (d // spec.n_head)
    return {"q_proj": (d, d), "k_proj": (d, kv_dim), "v_proj": (d, kv_dim), "o_proj": (d, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}


def adapter_tensors(spec: RunSpec) -> list[int]:
    """One block's LoRA tensors: A (r x in) and B (out x r) for each targeted projection."""
    dims = projection_dims(spec)
    return [spec.lora_rank * side for t in spec.adapter_targets if t in dims for side in dims[t]]


def adapter_params(spec: RunSpec) -> int:
    """LoRA parameters: rank x (in + out) for each targeted projection of every block."""
    return spec.n_layer * sum(adapter_tensors(spec))


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


def block_tensors(spec: RunSpec) -> list[tuple[int, bool]]:
    """One transformer block's parameter tensors as (elements, is a linear layer's weight: what
    qlora quantises), in the model's order."""
    d, f = spec.n_embd, spec.ffn_width
    if spec.arch == "gpt":
        return [(d, False), (d, False), (3 * d * d, True), (d * d, True), (d, False), (d, False),
                (4 * d * d, True), (4 * d * d, True)]
    kv_dim = spec.kv_heads * (d // spec.n_head)
    attention = [(d * d, True), (d * kv_dim, True), (d * kv_dim, True), (d * d, True)]
    if spec.arch == "qwen2":
        attention += [(d, False), (kv_dim, False), (kv_dim, False)]
    return [(d, False), (d, False), *attention, (d * f, True), (d * f, True), (f * d, True)]


def block_matmuls(spec: RunSpec) -> list[tuple[int, bool]]:
    """One block's linear layers in the order its forward runs them, as (weights, has a bias)."""
    d, f = spec.n_embd, spec.ffn_width
    if spec.arch == "gpt":
        return [(3 * d * d, False), (d * d, False), (4 * d * d, False), (4 * d * d, False)]
    kv_dim = spec.kv_heads * (d // spec.n_head)
    biased = spec.arch == "qwen2"  # q, k and v
    return [(d * d, biased), (d * kv_dim, biased), (d * kv_dim, biased), (d * d, False), (d * f, False),
            (d * f, False), (f * d, False)]


def tensor_numels(spec: RunSpec) -> tuple[list[int], list[int]]:
    """(root tensors, one block's tensors): the element count of every parameter tensor of a
    pretrain model, outside the transformer blocks (embeddings, untied head, final norm: FSDP's
    root unit) and inside one block, in the model's own order."""
    d, v = spec.n_embd, spec.vocab_size
    if spec.arch == "gpt":
        root = [v * d, spec.block_size * d, d, d]
    else:
        root = [v * d, d] + ([] if spec.tie_embeddings else [v * d])
    return root, [n for n, _ in block_tensors(spec)]


def optimizer_groups(spec: RunSpec) -> tuple[list[int], list[int]]:
    """The trainable tensors' element counts as the harness's AdamW holds them
    (harness/parallel/engine.py make_optimizer): the matrices, with weight decay, then the vectors
    (norms, biases), each in the model's order. DeepSpeed flattens and partitions each group on its
    own, so this is the layout its ZeRO partitions cut."""
    d, v = spec.n_embd, spec.vocab_size
    if spec.workload != "pretrain":  # lora/qlora: only the adapters train, every one a matrix
        return adapter_tensors(spec) * spec.n_layer, []
    block = block_tensors(spec)  # (elements, a linear layer's weight: a matrix)
    if spec.arch == "gpt":  # wte, wpe, the blocks, ln_f (weight, bias)
        tensors = [(v * d, True), (spec.block_size * d, True), *block * spec.n_layer, (d, False), (d, False)]
    else:  # embed, the blocks, the final norm, the head unless tied
        head = [] if spec.tie_embeddings else [(v * d, True)]
        tensors = [(v * d, True), *block * spec.n_layer, (d, False), *head]
    return [n for n, matrix in tensors if matrix], [n for n, matrix in tensors if not matrix]


def zero_touched(groups: tuple[list[int], ...] | list[list[int]], world_size: int) -> int:
    """The most elements any rank's ZeRO-2 gradient buffer holds: DeepSpeed sizes it as every tensor
    its partitions touch, whole (stage_1_and_2.py copy_grads_in_partition), the partition of each
    group being a 1/N slice of the group flattened in order (get_partition_info). A tensor that
    straddles a boundary counts whole on both ranks, so at large N this is well above P/N."""
    return max(zero_touched_by_rank(groups, world_size))


def zero_touched_by_rank(groups: tuple[list[int], ...] | list[list[int]], world_size: int) -> list[int]:
    """``zero_touched`` for every rank, in rank order."""
    per_rank = [0] * world_size
    for tensors in groups:
        # DeepSpeed pads the flat group to a multiple of 2 x N elements (nccl_start_alignment_factor)
        size = 2 * -(-sum(tensors) // (2 * world_size))
        start = 0
        for n in tensors:
            if n:
                for rank in range(start // size, min(world_size, (start + n - 1) // size + 1)):
                    per_rank[rank] += n
            start += n
    return per_rank


def stored_tensors(spec: RunSpec) -> tuple[list[tuple[int, float, bool]], list[tuple[int, float, bool]]]:
    """(root, one block): every parameter tensor as the harness stores it, as (elements, bytes,
    trainable). fp32, 4 B; qlora's block linear weights packed NF4 in fp32 containers (0.5 B a
    weight, an eighth of the elements; the quantisation state is not a parameter); lora/qlora
    adapters A (r x in) and B (out x r) beside each targeted projection, the only trainable ones."""
    root = tensor_numels(spec)[0]
    frozen = spec.workload != "pretrain"
    root_t = [(n, 4.0 * n, not frozen) for n in root]
    block_t = [(n // 8, 0.5 * n, False) if spec.workload == "qlora" and linear else (n, 4.0 * n, not frozen)
               for n, linear in block_tensors(spec)]
    if frozen:
        block_t += [(n, 4.0 * n, True) for n in adapter_tensors(spec)]
    return root_t, block_t


def payloads(spec: RunSpec) -> dict[str, float]:
    """Bytes of each payload the strategy table's sends name (harness/strategies.py), for parameters
    stored as the harness stores them (``stored_tensors``): what a formula multiplies by its counts.
    Measured equal to the recorded traffic for pretrain (tests/harness/test_traffic.py) and for lora
    and qlora (the same, on the tiny Mistral) at ws2.

        grads             P_t gradients, 4 B (2 with variant bf16-reduce)
        (with dtype bf16 run natively, RunSpec.precision, the row's bf16_payloads are sent in bf16:
        half their fp32 bytes; qlora, whose packed weights are not cast, runs autocast)
        params            every parameter as stored (fp32; qlora's packed NF4 weights 0.5 B each)
        trainable         P_t parameters, 4 B each
        blocks            the parameters inside the transformer blocks (all but FSDP's root unit)
        unit_grads        FSDP1's reduce-scatter: the whole flat parameter of every unit holding a
                          trainable one (use_orig_params=True: frozen weights' zeros included), at
                          the gradient width per 4 stored bytes; pretrain: grads
        zero3_sharded     ZeRO-3's partitioned parameters: every tensor of more than
                          stage3_param_persistence_threshold elements (harness/configs/zero3.json)
        zero3_persistent  the others: kept whole on every rank, gathered once per step
        zero3_regathered  partitioned tensors gathered again in backward: those whose next use lies
                          more than stage3_max_reuse_distance parameters ahead in the module order
                          (DeepSpeed's PartitionedParameterCoordinator.__params_to_release)
    """
    grad_bytes = 2 if "bf16-reduce" in spec.variant_parts() else 4
    zero = json.loads(ZERO3_CONFIG.read_text())["zero_optimization"]
    threshold = zero["stage3_param_persistence_threshold"]
    root, block = stored_tensors(spec)
    tensors = root + block * spec.n_layer
    params = sum(b for _, b, _ in tensors)
    trainable = sum(n for n, _, t in tensors if t)
    block_bytes = sum(b for _, b, _ in block)
    sharded_block = sum(b for n, b, _ in block if n > threshold)
    # Forward runs the embedding, blocks 1..L, the final norm and the head; backward the reverse.
    # Between block k's use in forward and in backward, every later block goes by twice and the
    # final norm and head once: beyond the reuse distance (counted in elements) its partitioned
    # tensors are released and gathered again. The embedding's reuse spans the whole model.
    numels, block_numel = [n for n, _, _ in root], sum(n for n, _, _ in block)
    if spec.arch == "gpt":
        after_blocks = numels[2] + numels[3] + numels[0]  # final LayerNorm, tied head
    else:
        after_blocks = numels[1] + numels[-1]  # final norm, head (the embedding when tied)
    regathered = sum(sharded_block for k in range(1, spec.n_layer + 1)
                     if 2 * (spec.n_layer - k) * block_numel + after_blocks >= DEEPSPEED_MAX_REUSE_DISTANCE)
    if sum(n for n, _, _ in tensors) >= DEEPSPEED_MAX_REUSE_DISTANCE and root[0][0] > threshold:
        regathered += root[0][1]
    sharded = sum(b for n, b, _ in tensors if n > threshold)
    frozen = spec.workload != "pretrain"
    units = block_bytes * spec.n_layer * grad_bytes / 4 if frozen else grad_bytes * trainable
    out = {"grads": grad_bytes * trainable, "params": params, "trainable": 4.0 * trainable,
           "blocks": block_bytes * spec.n_layer, "unit_grads": units, "zero3_sharded": sharded,
           "zero3_persistent": params - sharded, "zero3_regathered": regathered}
    if spec.precision == "native":  # the strategy sends these in bf16 (its row's bf16_payloads)
        for name in strategies.get(spec.strategy).bf16_payloads:
            out[name] = 2.0 * trainable if name == "grads" else out[name] / 2
    return out
