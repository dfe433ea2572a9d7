"""FLOPs per token, device peak FLOP/s and MFU. Standard library only.

Formula (PaLM, Chowdhery et al. 2022, Appendix B; as nanoGPT ``estimate_mfu``):

    flops_per_token = 6 N + 12 L H Q T

N = non-embedding parameters, counting the tied token embedding once because it is
also the LM head (nanoGPT ``get_num_params(non_embedding=True)``: only the position
embedding is subtracted); L layers, H heads, Q head dim, T sequence length. The
attention term counts the full T x T score matrix (no causal discount), by convention.
"""

from __future__ import annotations

import re

FLOPS_FORMULA = "6N + 12LHQT (PaLM App. B; N = params excluding position embedding)"

# Peak dense bf16 tensor-core FLOP/s, from vendor datasheets (no sparsity).
# Order matters: the first pattern that matches the device name wins.
PEAK_FLOPS_BF16: list[tuple[str, str, float]] = [
    # (label, regex on torch.cuda.get_device_name(), FLOP/s)
    ("H200", r"\bH200\b", 989e12),
    ("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756e12),
    ("H100 NVL", r"\bH100\b.*\bNVL\b", 835e12),
    ("H100 SXM", r"\bH100\b", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", r"\bA100\b", 312e12),
    ("L40S", r"\bL40S\b", 362e12),
    ("A10", r"\bA10\b(?!0)", 125e12),  # not A100; A10G is a different part (no entry)
]


def non_embedding_params(*, n_params: int, block_size: int, n_embd: int) -> int:
    """Parameters counted in 6N: all parameters minus the learned position embedding."""
    return n_params - block_size * n_embd


def flops_per_token(*, n_params_non_embedding: int, n_layer: int, n_head: int,
                    n_embd: int, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token: 6N + 12LHQT."""
    head_dim = n_embd // n_head
    return 6.0 * n_params_non_embedding + 12.0 * n_layer * n_head * head_dim * seq_len


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
