"""FLOPs per token, device peak FLOP/s and MFU. Standard library only.

Formula (PaLM, Chowdhery et al. 2022, Appendix B; as nanoGPT ``estimate_mfu``):

    flops_per_token = 6 N + 12 L H Q T

N = parameters that are multiplied, not only looked up: every parameter minus the GPT's
learned position embedding and, when the LM head is not tied to it, the input token
embedding (a tied embedding is counted once, as the head; nanoGPT
``get_num_params(non_embedding=True)``). So grouped-query attention, SwiGLU's three
matrices and an untied head enter through the parameters the model really has. L layers,
H query heads, Q head dim, T sequence length: the attention term counts the full T x T
score matrix (no causal discount), by convention; key/value heads do not change it.

LoRA and QLoRA (frozen base weights): no weight gradient is computed for a frozen matrix,
only the input gradient, so

    flops_per_token = 4 N_frozen + 6 N_trainable + 12 L H Q T

with N_trainable the adapters and N_frozen = N - N_trainable (a 4-bit weight counts as the
matrix it stands for; dequantisation and recompute are not model FLOPs).
"""

from __future__ import annotations

from harness import devices

FLOPS_FORMULA = ("6N + 12LHQT (PaLM App. B; N = parameters excluding embedding tables that are only "
                 "looked up)")
FLOPS_FORMULA_FROZEN = ("4 N_frozen + 6 N_trainable + 12LHQT (no weight gradients for frozen weights; "
                        "dequantisation and recompute are not model FLOPs)")

def non_embedding_params(*, n_params: int, n_embd: int, vocab_size: int, block_size: int,
                         learned_positions: bool, tied_embedding: bool) -> int:
    """N: all parameters minus the tables that are only looked up (learned positions; an
    input embedding that is not also the LM head)."""
    positions = block_size * n_embd if learned_positions else 0
    return n_params - positions - (0 if tied_embedding else vocab_size * n_embd)


def flops_per_token(*, n_params_non_embedding: int, n_layer: int, n_head: int,
                    n_embd: int, seq_len: int, n_trainable: int | None = None) -> float:
    """Training FLOPs (forward + backward) per token: 6N + 12LHQT, or with frozen weights
    4 N_frozen + 6 N_trainable + 12LHQT (``n_trainable`` None: everything trains)."""
    head_dim = n_embd // n_head
    trainable = n_params_non_embedding if n_trainable is None else n_trainable
    frozen = n_params_non_embedding - trainable
    return 6.0 * trainable + 4.0 * frozen + 12.0 * n_layer * n_head * head_dim * seq_len


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """Peak dense bf16 FLOP/s of one device (the device table's row for the name the driver reports,
    harness/devices.py) and how it was chosen.

    Returns (None, reason) for a device not in the table: MFU is then left empty
    rather than guessed (torchtitan falls back to the A100's 312 TF; we do not).
    """
    part = devices.by_gpu_name(device_name)
    if part is None:
        return None, f"no peak FLOP/s known for device {device_name!r}; MFU left empty"
    return part.dense_bf16_tflops * 1e12, f"{part.label} dense bf16 peak {part.dense_bf16_tflops:g} TFLOP/s"


def mfu(*, flops_per_token: float, tokens_per_s_per_device: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation as a fraction (0.4 = 40%)."""
    return flops_per_token * tokens_per_s_per_device / peak_flops_per_s
