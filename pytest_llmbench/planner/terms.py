"""The memory planner's types (pytest_llmbench/planner/memory.py computes them): a model's shape as the
planner needs it, a named term of bytes, and an estimate (the terms alive at one moment of a step).
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.shapes import (
    NF4_BYTES_PER_PARAM,
    adapter_params,
    optimizer_groups,
    param_counts,
    weight_bytes,
    zero_touched,
)
from harness.spec import RunSpec

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """What the planner needs of a model, from its spec alone (harness/shapes.py)."""

    params: int  # P: every parameter (a quantised weight counted as the matrix it stands for)
    trainable: int  # P_t
    weight_bytes_fp32: float  # W as the harness stores it (fp32, NF4 for qlora's frozen linears)
    packed_bytes: float  # the NF4 part of W (qlora), the same in 16-bit training
    block: int  # one transformer block's parameters
    n_layer: int
    largest_layer: int  # the largest single module's parameters (DeepSpeed's largest_layer_params)
    # AdamW's two groups, trainable tensors' elements in order (harness/shapes.py optimizer_groups)
    groups: tuple[tuple[int, ...], ...] = ()
    tied: bool = False  # the LM head is the token embedding (one tensor, two gradients summed)

    @property
    def weight_bytes_16(self) -> float:
        """W in 16-bit training: bf16 where the harness stores fp32."""
        return (self.weight_bytes_fp32 - self.packed_bytes) / 2 + self.packed_bytes

    @property
    def root(self) -> int:
        """The FSDP root unit: what is outside the blocks (embeddings, head, final norm)."""
        return self.params - self.n_layer * self.block

    @classmethod
    def of(cls, spec: RunSpec) -> Shape:
        counts = param_counts(spec)
        adapters = adapter_params(spec) if spec.workload != "pretrain" else 0
        trainable = counts.total if spec.workload == "pretrain" else adapters
        quantised = counts.linear if spec.workload == "qlora" else 0
        largest = max(spec.vocab_size * spec.n_embd, spec.n_embd * max(spec.ffn_width, 3 * spec.n_embd))
        return cls(params=counts.total + adapters, trainable=trainable,
                   weight_bytes_fp32=weight_bytes(spec), packed_bytes=NF4_BYTES_PER_PARAM * quantised,
                   block=counts.block, n_layer=counts.n_layer, largest_layer=largest,
                   groups=tuple(tuple(g) for g in optimizer_groups(spec)),
                   tied=spec.tie_embeddings and spec.workload == "pretrain")

    @property
    def largest_trainable(self) -> int:
        """The largest tensor AdamW updates (the embedding or an MLP matrix; an adapter for LoRA)."""
        return max((n for g in self.groups for n in g), default=self.trainable)

    @property
    def largest_group(self) -> int:
        """The larger of AdamW's two groups (the matrices, with weight decay)."""
        return max((sum(g) for g in self.groups), default=self.trainable)

    def zero2_gradient_buffer(self, n: int) -> int:
        """Elements of the fullest rank's ZeRO-2 gradient buffer: every tensor its partitions touch."""
        return zero_touched(self.groups, n) if self.groups else -(-self.trainable // n)


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    formula: str  # the term in words and symbols, as the report prints it
    state: bool = True  # a model state (weights, gradients, optimizer, their copies and buffers)


@dataclass
class Estimate:
    """One strategy at one N: the terms at the peak moment and the total. Estimated."""

    strategy: str
    world_size: int
    grad_accum: int
    precision: str
    moment: str  # "backward" or "optimizer": which moment is the peak
    terms: list[Term] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def states(self) -> float:
        return sum(t.bytes for t in self.terms if t.state)

    def by_category(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in self.terms:
            out[t.name] = out.get(t.name, 0.0) + t.bytes
        return out

    def describe(self) -> str:
        """``name x.xx (formula)`` for every term (GiB), in order."""
        return " + ".join(f"{t.name} {t.bytes / GIB:.2f} ({t.formula})" for t in self.terms if t.bytes)
