"""A model's operator profile (planner/opcount.py counts the operators): one micro-batch's operators
outside the blocks and in one block, by phase and class, from the model built at depths 1 and 2 (a
Hugging Face config.json's architecture, or a RunSpec's own model), with its parameter counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pytest_llmbench.planner.opcount import Count, count, hf_config, quiet, with_positions


@dataclass
class Profile:
    """What one micro-batch runs: the model outside its blocks and one block, each by phase and class."""

    outside: Count
    block: Count
    n_layer: int
    params: int
    block_params: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int


def profile(config: dict[str, Any], *, micro_batch: int, seq_len: int) -> Profile:
    """The operator profile of a Hugging Face ``config`` (its config.json as a dict: any architecture
    transformers builds from a config) at one micro-batch, counted at depths 1 and 2."""
    import transformers

    config = with_positions(config, seq_len)
    base = hf_config(config)

    def build(depth: int) -> Callable[[], torch.nn.Module]:
        def make() -> torch.nn.Module:
            cfg = hf_config(config)
            cfg.num_hidden_layers = depth
            # a config is data: its auto_map (custom code, local or on the Hub) is dropped by hf_config
            # and never trusted here
            return _Plain(transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=False))

        return make

    heads = base.num_attention_heads
    kv_heads = getattr(base, "num_key_value_heads", None) or heads
    return _profile(
        build,
        n_layer=base.num_hidden_layers,
        heads=heads,
        kv_heads=kv_heads,
        hidden=base.hidden_size,
        vocab=base.vocab_size,
        micro_batch=micro_batch,
        seq_len=seq_len,
    )


def profile_spec(spec) -> Profile:
    """The operator profile of a RunSpec's own model (harness/model.py: the project's GPT, or the
    transformers architecture of a preset) at its micro-batch and sequence length."""
    from harness.model import build_model

    def build(depth: int) -> Callable[[], torch.nn.Module]:
        return lambda: build_model(spec.replace(n_layer=depth, workload="pretrain"), torch.device("cpu"))

    return _profile(
        build,
        n_layer=spec.n_layer,
        heads=spec.n_head,
        kv_heads=spec.kv_heads,
        hidden=spec.n_embd,
        vocab=spec.vocab_size,
        micro_batch=spec.micro_batch,
        seq_len=spec.seq_len,
    )


def _profile(
    build, *, n_layer: int, heads: int, kv_heads: int, hidden: int, vocab: int, micro_batch: int, seq_len: int
) -> Profile:
    one = count(build(1), micro_batch=micro_batch, seq_len=seq_len, vocab_size=vocab, heads=heads)
    two = count(build(2), micro_batch=micro_batch, seq_len=seq_len, vocab_size=vocab, heads=heads)
    block = two.minus(one)
    outside = one.minus(block)
    params = _parameters(build, n_layer)
    return Profile(outside, block, n_layer, params[0], params[1], heads, kv_heads, hidden // heads, hidden)


def _parameters(build, n_layer: int) -> tuple[int, int]:
    """(every parameter at full depth, one block's), from the models at depths 1 and 2 (fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), quiet():
        one, two = (sum(p.numel() for p in build(d)().parameters()) for d in (1, 2))
    return one + (n_layer - 1) * (two - one), two - one


class _Plain(torch.nn.Module):
    """Any ``*ForCausalLM`` behind ``forward(idx, targets) -> loss`` (its logits, fp32 cross-entropy)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=idx, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
