"""RunSpec: the one description of a benchmark run that crosses process boundaries.

Standard library only: the pytest plugin, the launchers and the harness all import it.
A spec travels as JSON (``to_dict`` / ``from_dict``); every field is validated in
``__post_init__`` so a bad value fails where it was written, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_VERSION = 2  # 2 added ``variant``; version 1 specs are still read (as the base variant)
READABLE_SPEC_VERSIONS = (1, 2)

STRATEGIES = ("ddp", "fsdp", "fsdp1", "zero2", "zero3")
"""ddp: torch DDP. fsdp: FSDP2 ``fully_shard`` per block and root. fsdp1: classic
FullyShardedDataParallel with a transformer-block wrap policy. zero2/zero3: DeepSpeed."""

# Variants of a strategy: knobs users turn with it. A spec's ``variant`` is "base" or parts
# joined by "+", e.g. "ac+bucket100". Each strategy module applies the parts it supports.
VARIANTS: dict[str, str] = {
    "ac": "activation checkpointing of every transformer block (non-reentrant), before wrapping",
    "offload": "parameters/optimizer state offloaded to CPU memory (FSDP CPU offload, ZeRO offload)",
    "bf16-reduce": "gradients reduced in bf16",
    "powersgd<rank>": "DDP PowerSGD gradient compression of that rank, error feedback on",
    "bucket<MB>": "gradient bucket size in MiB (DDP bucket_cap_mb; ZeRO reduce_bucket_size)",
    "noreshard": "parameters kept unsharded after forward (FSDP2 reshard_after_forward=False, "
                 "FSDP1 SHARD_GRAD_OP)",
    "hsdp": "FSDP2 on a 2-D mesh: replicated across nodes, sharded within each node (multi-node cases)",
}
# Which strategies implement which variant; anything else is a skip with this reason.
VARIANT_STRATEGIES: dict[str, tuple[tuple[str, ...], str]] = {
    "ac": (("ddp", "fsdp", "fsdp1", "zero2", "zero3"), ""),
    "offload": (("fsdp", "fsdp1", "zero2", "zero3"),
                "DDP keeps a full replica on every device: nothing to offload"),
    "bf16-reduce": (("ddp", "fsdp", "fsdp1", "zero2", "zero3"), ""),
    "powersgd": (("ddp",), "PowerSGD is a DDP communication hook"),
    "bucket": (("ddp", "zero2", "zero3"), "FSDP reduces per wrapped unit, it has no bucket size"),
    "noreshard": (("fsdp", "fsdp1"), "only FSDP reshards parameters after forward"),
    "hsdp": (("fsdp",), "HSDP here is FSDP2 fully_shard on a 2-D device mesh"),
}

DTYPES = ("fp32", "bf16")
DEVICES = ("cpu", "cuda")

# Model shapes by name. ``block_size`` is the number of learned positions.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    # Small enough for 2 CPU cores: ~0.8M parameters, well under a second per step.
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, vocab_size=1024, block_size=512),
    # ~153M parameters: large enough that peak RSS on CPU shows parameter sharding.
    "cpu-150m": dict(n_layer=12, n_head=16, n_embd=1024, vocab_size=1024, block_size=512),
    # GPT-2 family, vocab padded to a multiple of 64 as in nanoGPT.
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024),
    "gpt2-350m": dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, block_size=1024),
    "gpt2-774m": dict(n_layer=36, n_head=20, n_embd=1280, vocab_size=50304, block_size=1024),
    "gpt2-1558m": dict(n_layer=48, n_head=25, n_embd=1600, vocab_size=50304, block_size=1024),
}


class SpecError(ValueError):
    """A spec field is invalid. The message names the field."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    # model
    model: str = "tiny"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    vocab_size: int = 1024
    block_size: int = 512
    seq_len: int = 128
    # batching and length
    micro_batch: int = 8
    grad_accum: int = 1
    steps: int = 10
    warmup_steps: int = 3
    # precision and parallelism
    dtype: str = "fp32"
    strategy: str = "ddp"
    world_size: int = 1
    nnodes: int = 1
    device: str = "cpu"
    threads_per_rank: int = 0  # CPU only; 0 = cores // local ranks
    variant: str = "base"  # "base" or VARIANTS parts joined by "+", e.g. "ac+bucket100"
    # optimizer, identical for every strategy (torch.optim.AdamW, constant lr)
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # data and measurement
    seed: int = 1234
    data_pool: int = 256  # distinct synthetic samples, cycled so the loss can fall
    compute_probe_steps: int = 3  # steps of the unwrapped model with no collectives
    extra: dict[str, Any] = field(default_factory=dict)  # free-form labels, recorded only

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "seq_len",
                     "micro_batch", "grad_accum", "steps", "world_size", "nnodes", "data_pool"):
            _require_int(self, name, minimum=1)
        for name in ("warmup_steps", "threads_per_rank", "compute_probe_steps", "seed"):
            _require_int(self, name, minimum=0)
        _require_choice(self, "strategy", STRATEGIES)
        _require_choice(self, "dtype", DTYPES)
        _require_choice(self, "device", DEVICES)
        if self.steps <= self.warmup_steps:
            raise SpecError(f"steps: {self.steps} must be greater than warmup_steps "
                            f"({self.warmup_steps}); nothing would be measured")
        if self.seq_len > self.block_size:
            raise SpecError(f"seq_len: {self.seq_len} exceeds the model's {self.block_size} "
                            f"positions (block_size of model {self.model!r})")
        if self.n_embd % self.n_head:
            raise SpecError(f"n_embd: {self.n_embd} is not divisible by n_head={self.n_head}")
        if self.world_size % self.nnodes:
            raise SpecError(f"world_size: {self.world_size} is not divisible by nnodes={self.nnodes}")
        for name in ("lr", "eps"):
            _require_number(self, name, positive=True)
        for name in ("weight_decay", "grad_clip"):
            _require_number(self, name, positive=False)
        if (not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas)):
            raise SpecError(f"betas: {self.betas!r} must be two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        self.variant_parts()  # raises SpecError on an unknown or repeated part
        if not isinstance(self.extra, dict):
            raise SpecError(f"extra: {self.extra!r} must be a table/dict")

    # ---- derived ------------------------------------------------------------------
    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step over all ranks and micro-batches."""
        return self.world_size * self.micro_batch * self.grad_accum * self.seq_len

    @property
    def case_id(self) -> str:
        """Readable id of the case, e.g. ``zero2-ws4-seq2048``, ``fsdp+ac-ws8-seq2048``."""
        variant = "" if self.variant == "base" else f"+{self.variant}"
        return f"{self.strategy}{variant}-ws{self.world_size}-seq{self.seq_len}"

    def variant_parts(self) -> dict[str, int | None]:
        """The variant's parts, e.g. {"ac": None, "bucket": 100}; {} for "base"."""
        return parse_variant(self.variant)

    def variant_problem(self) -> str | None:
        """Why this strategy, device or layout cannot run the variant, or None if it can."""
        for name in self.variant_parts():
            strategies, why = VARIANT_STRATEGIES[name]
            if self.strategy not in strategies:
                return f"variant {name} does not apply to {self.strategy}: {why}"
            if name == "bf16-reduce" and self.strategy == "ddp" and self.device == "cpu":
                return ("variant bf16-reduce on ddp is torch's bf16_compress_hook, which torch refuses "
                        "on gloo (it requires CUDA 11+ and NCCL 2.10+)")
            if name == "hsdp" and self.nnodes == 1:
                return ("variant hsdp replicates across nodes and shards within each: this case runs on "
                        "one node (plain fsdp is the same thing there)")
            if name == "offload" and self.device == "cpu":
                return ("variant offload moves state from the accelerator to CPU memory: meaningless "
                        "on a CPU-only run")
        return None

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    # ---- JSON -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        data["spec_version"] = SPEC_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        if not isinstance(data, dict):
            raise SpecError(f"a spec must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("spec_version", SPEC_VERSION)
        if version not in READABLE_SPEC_VERSIONS:
            raise SpecError(f"spec_version: {version!r} is not supported (this version reads "
                            f"{', '.join(map(str, READABLE_SPEC_VERSIONS))})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "betas" in data and isinstance(data["betas"], list):
            data["betas"] = tuple(data["betas"])
        return cls(**data)

    @classmethod
    def from_preset(cls, model: str, **overrides: Any) -> RunSpec:
        """A spec with the shape of a named model preset; ``overrides`` win."""
        if model not in MODEL_PRESETS:
            raise SpecError(f"model: unknown preset {model!r}; known: {', '.join(MODEL_PRESETS)}")
        return cls(model=model, **{**MODEL_PRESETS[model], **overrides})

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def parse_variant(variant: Any) -> dict[str, int | None]:
    """The parts of a variant name, e.g. {"ac": None, "bucket": 100}; {} for "base". A
    SpecError names an unknown or repeated part, or hooks that exclude each other."""
    if not isinstance(variant, str) or not variant:
        raise SpecError(f"variant: {variant!r} must be 'base' or parts joined by '+'")
    if variant == "base":
        return {}
    parts: dict[str, int | None] = {}
    for part in variant.split("+"):
        name, number = part.rstrip("0123456789"), part[len(part.rstrip("0123456789")):]
        numbered = name in ("powersgd", "bucket")
        if name not in VARIANT_STRATEGIES or numbered != bool(number) or (number and int(number) < 1):
            raise SpecError(f"variant: unknown part {part!r} in {variant!r}; known: {', '.join(VARIANTS)}")
        if name in parts:
            raise SpecError(f"variant: {name!r} appears twice in {variant!r}")
        parts[name] = int(number) if number else None
    if "powersgd" in parts and "bf16-reduce" in parts:
        raise SpecError(f"variant: {variant!r}: powersgd and bf16-reduce are both DDP "
                        f"communication hooks; choose one")
    return parts


def load_spec(path: str | Path) -> RunSpec:
    """Read a spec file; every problem is a SpecError naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec file: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from None
    try:
        return RunSpec.from_dict(data)
    except TypeError as exc:  # e.g. a wrong-typed nested value
        raise SpecError(f"{path}: {exc}") from None
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def _require_int(spec: RunSpec, name: str, *, minimum: int) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: {value!r} is not an integer")
    if value < minimum:
        raise SpecError(f"{name}: {value} must be >= {minimum}")


def _require_number(spec: RunSpec, name: str, *, positive: bool) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{name}: {value!r} is not a number")
    if value < 0 or (positive and value == 0):
        raise SpecError(f"{name}: {value} must be {'> 0' if positive else '>= 0'}")


def _require_choice(spec: RunSpec, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    if value not in choices:
        raise SpecError(f"{name}: unknown value {value!r}; choose one of {', '.join(choices)}")
