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

import re

FLOPS_FORMULA = ("6N + 12LHQT (PaLM App. B; N = parameters excluding embedding tables that are only "
                 "looked up)")
FLOPS_FORMULA_FROZEN = ("4 N_frozen + 6 N_trainable + 12LHQT (no weight gradients for frozen weights; "
                        "dequantisation and recompute are not model FLOPs)")

# Peak dense bf16 tensor-core FLOP/s, from vendor datasheets (no sparsity).
# Order matters: the first pattern that matches the device name wins.
PEAK_FLOPS_BF16: list[tuple[str, str, float]] = [
    # (label, regex on torch.cuda.get_device_name(), FLOP/s)
    # NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS (SXM) and 1,671 TFLOPS (NVL), both
    # "with sparsity": dense is half. The NVL part must match before the SXM pattern.
    ("H200 NVL", r"\bH200\b.*\bNVL\b", 835e12),
    ("H200", r"\bH200\b", 989e12),
    ("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756e12),
    ("H100 NVL", r"\bH100\b.*\bNVL\b", 835e12),
    ("H100 SXM", r"\bH100\b", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", r"\bA100\b", 312e12),
    ("L40S", r"\bL40S\b", 362e12),
    ("A10", r"\bA10\b(?!0)", 125e12),  # not A100; A10G is a different part (no entry)
]


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
    """Peak dense bf16 FLOP/s of one device and how it was chosen.

    Returns (None, reason) for a device not in the table: MFU is then left empty
    rather than guessed (torchtitan falls back to the A100's 312 TF; we do not).
    """
    for label, pattern, value in PEAK_FLOPS_BF16:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return value, f"{label} dense bf16 peak {value / 1e12:g} TFLOP/s"
    return None, f"no peak FLOP/s known for device {device_name!r}; MFU left empty"


def mfu(*, flops_per_token: float, tokens_per_s_per_device: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation as a fraction (0.4 = 40%)."""
    return flops_per_token * tokens_per_s_per_device / peak_flops_per_s
