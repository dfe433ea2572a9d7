"""A causal GPT in the nanoGPT shape (karpathy/nanoGPT model.py).

Learned positions, pre-LN blocks, ``scaled_dot_product_attention(is_causal=True)``,
next-token targets, token embedding tied to the LM head, no biases, no dropout (so
every strategy computes the same function and the losses can be compared).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness.spec import RunSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    block_class = Block  # the unit wrap policies and activation checkpointing act on

    def __init__(self, *, n_layer: int, n_head: int, n_embd: int, vocab_size: int,
                 block_size: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(_init_weights)
        for name, param in self.named_parameters():  # GPT-2 scaled residual init
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``idx`` predicting ``targets``."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def build_model(spec: RunSpec, device: torch.device) -> nn.Module:
    """The spec's model on ``device``, initialised from ``spec.seed`` (identical on every rank),
    with its workload applied (harness/workload.py). Sets ``n_params`` (every parameter, a
    quantised weight counted as the matrix it stands for, adapters included), ``n_trainable``
    and ``workload_config`` (what the workload did) on the model."""
    torch.manual_seed(spec.seed)
    if spec.arch == "gpt":
        model = GPT(n_layer=spec.n_layer, n_head=spec.n_head, n_embd=spec.n_embd,
                    vocab_size=spec.vocab_size, block_size=spec.block_size)
        if device.type != "cpu":  # (a no-op on CPU that FakeTensorMode refuses: planner/memref.py)
            model = model.to(device)
    else:
        from harness.hf import build_hf

        model = build_hf(spec, device)
    from harness.workload import apply_workload, dense_numel

    base_params = sum(dense_numel(p) for p in model.parameters())

    model.workload_config = apply_workload(model, spec, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.n_trainable = sum(p.numel() for p in trainable)
    model.n_params = base_params + (model.n_trainable if spec.workload != "pretrain" else 0)
    return model


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
