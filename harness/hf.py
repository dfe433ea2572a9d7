"""Hugging Face causal LMs (Llama, Mistral, Qwen2) from their config classes, random weights.

No hub access and no download: the config is built from the spec's shape (the published
config.json values, ``harness.spec.MODEL_PRESETS``) plus the values below that do not change
the shape. ``transformers`` is imported only here, so a GPT case never pays its import.

``CausalLM`` gives the model the harness's interface: ``forward(idx, targets)`` returns the
mean next-token cross-entropy computed exactly as the GPT model does (logits in fp32), and
``blocks`` / ``block_class`` name the decoder layers for wrap policies and recompute.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.spec import RunSpec

# Published config.json values that leave the shape alone (sources: the presets' comments in
# harness/spec.py). Names are transformers 5 config fields.
CONFIG_EXTRAS: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama3.2-1b": dict(rms_norm_eps=1e-5, head_dim=64, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama2-7b": dict(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "mistral-7b": dict(rms_norm_eps=1e-5, sliding_window=4096,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "mistral-7b-v0.3": dict(rms_norm_eps=1e-5, sliding_window=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen2.5-7b": dict(rms_norm_eps=1e-6, use_sliding_window=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "qwen2.5-0.5b": dict(rms_norm_eps=1e-6, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}


def hf_config(spec: RunSpec):
    """The transformers config of the spec's architecture and shape (sdpa attention, no KV cache)."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config}[spec.arch]
    config = cls(vocab_size=spec.vocab_size, hidden_size=spec.n_embd, intermediate_size=spec.ffn_width,
                 num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                 num_key_value_heads=spec.kv_heads, max_position_embeddings=spec.block_size,
                 tie_word_embeddings=spec.tie_embeddings, use_cache=False,
                 **CONFIG_EXTRAS.get(spec.model, {}))
    config._attn_implementation = "sdpa"  # F.scaled_dot_product_attention, as the GPT model
    return config


class CausalLM(nn.Module):
    """A transformers ``*ForCausalLM`` behind the harness's model interface."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        layers = lm.get_decoder().layers
        self.__dict__["_blocks"] = layers  # a reference, not a second registration of the layers
        self.block_class = type(layers[0])

    @property
    def blocks(self) -> nn.ModuleList:
        return self.__dict__["_blocks"]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=idx).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def build_hf(spec: RunSpec, device: torch.device) -> CausalLM:
    """The architecture with transformers' own random initialisation, made on ``device``. For qlora
    it is built on the meta device and made real one module at a time, its linear layers quantised
    as they are made (``harness.workload.build_nf4``): the fp32 model never exists on the device."""
    import transformers

    cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
           "qwen2": transformers.Qwen2ForCausalLM}[spec.arch]
    if spec.workload != "qlora":
        with torch.device(device):
            return CausalLM(cls(hf_config(spec)))
    from harness.workload import build_nf4

    with torch.device("meta"):
        lm = cls(hf_config(spec))
    quantization = build_nf4(lm, spec, device)
    model = CausalLM(lm)
    model.quantization = quantization
    return model
