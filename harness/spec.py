"""RunSpec: the one description of a benchmark run that crosses process boundaries.

Standard library only: the pytest plugin, the launchers and the harness all import it. A spec travels as
JSON (``to_dict`` / ``from_dict``); every field is validated in ``__post_init__``, naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from harness import instruments, spec_checks, strategies
from harness.identity import IDENTITY_FREE, case_id, run_as, scaling_free
from harness.presets import MODEL_PRESETS
from harness.spec_checks import SpecError, parse_variant, require_choice, require_int, require_number
from harness.variants import VARIANTS

# 2 added ``variant``, 3 the architecture and workload fields, 4 ``benchmark``, ``scaling`` and the
# probe's, 5 ``trace_steps``, 6 ``memory_steps``, 7 ``instruments`` in their place; older specs read as
# the base variant, the GPT architecture, pretraining, a training run, weak scaling, no instruments
SPEC_VERSION, READABLE_SPEC_VERSIONS = 7, (1, 2, 3, 4, 5, 6, 7)
# the spec fields that asked for an instrument before ``instruments`` (5, 6) -> its name
OLD_INSTRUMENT_FIELDS = {"trace_steps": "trace", "memory_steps": "memory"}

# What a case measures: "train" a training run (harness/train.py), "collectives" the
# bandwidth of each collective over a sweep of message sizes (harness/collectives.py).
BENCHMARKS = ("train", "collectives")
# How the batch follows the world size: "weak" keeps the per-device batch (micro_batch x
# grad_accum), "strong" keeps the global batch (the profile splits it per world size).
SCALINGS = ("weak", "strong")

DTYPES = ("fp32", "bf16")
DEVICES = ("cpu", "cuda")

# Architectures: "gpt" is the project's own nanoGPT-shaped model (harness/model.py); the others
# are Hugging Face ``transformers`` causal LMs built from their config classes with random
# weights, offline (harness/hf.py).
ARCHS = ("gpt", "llama", "mistral", "qwen2")

# What trains. pretrain: every parameter. lora: the base frozen, peft LoRA adapters trained.
# qlora: the base's linear layers quantised to 4-bit NF4 (bitsandbytes), LoRA on top.
WORKLOADS = ("pretrain", "lora", "qlora")
# LoRA targets when the spec names none: the attention projections (peft matches name suffixes).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    # model
    model: str = "tiny"
    arch: str = "gpt"
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 0  # key/value heads (grouped-query attention); 0 = n_head
    n_embd: int = 128
    ffn_hidden: int = 0  # MLP width; 0 = 4 x n_embd (gpt)
    vocab_size: int = 1024
    block_size: int = 512
    tie_embeddings: bool = True  # LM head shares the token embedding
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
    # what trains (WORKLOADS) and, for lora/qlora, the adapters
    workload: str = "pretrain"
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0  # 0 keeps every strategy's loss curve comparable
    lora_targets: tuple[str, ...] = ()  # module names; () = DEFAULT_LORA_TARGETS of the arch
    # optimizer, identical for every strategy (torch.optim.AdamW, constant lr)
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # data and measurement
    benchmark: str = "train"  # BENCHMARKS
    scaling: str = "weak"  # SCALINGS: recorded so the report can say which kind each table is
    seed: int = 1234
    data_pool: int = 256  # distinct synthetic samples, cycled so the loss can fall
    compute_probe_steps: int = 3  # steps of the unwrapped model with no collectives
    # what runs after the measured steps, name -> its steps (harness/instruments: trace, memory, ...)
    instruments: dict[str, int] = field(default_factory=dict)
    # the collectives probe (benchmark = "collectives"): x2 message sizes, iterations per size
    comm_min_bytes: int = 8
    comm_max_bytes: int = 2**20
    comm_iters: int = 20
    comm_warmup_iters: int = 5
    extra: dict[str, Any] = field(default_factory=dict)  # free-form labels, recorded only

    def __post_init__(self) -> None:
        self._check_counts()
        spec_checks.check_model(self)
        self._check_training()

    def _check_counts(self) -> None:
        """Every count a whole number in range; every choice one the tables know."""
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "seq_len",
                     "micro_batch", "grad_accum", "steps", "world_size", "nnodes", "data_pool",
                     "comm_min_bytes", "comm_max_bytes", "comm_iters"):
            require_int(self, name, minimum=1)
        for name in ("warmup_steps", "threads_per_rank", "compute_probe_steps", "seed", "n_kv_head",
                     "ffn_hidden", "comm_warmup_iters"):
            require_int(self, name, minimum=0)
        for name in ("lora_rank", "lora_alpha"):
            require_int(self, name, minimum=1)
        require_choice(self, "strategy", strategies.names())
        for name, choices in (("arch", ARCHS), ("workload", WORKLOADS), ("benchmark", BENCHMARKS),
                              ("scaling", SCALINGS)):
            require_choice(self, name, choices)
        try:
            asked = instruments.check(self.instruments, stored=spec_checks.stored_now())
            object.__setattr__(self, "instruments", asked)
        except instruments.InstrumentError as exc:
            raise SpecError(f"instruments: {exc}") from None

    def _check_training(self) -> None:
        """Precision, device, steps, sequence, layout, optimizer and variant."""
        require_choice(self, "dtype", DTYPES)
        require_choice(self, "device", DEVICES)
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
            require_number(self, name, positive=True)
        for name in ("weight_decay", "grad_clip"):
            require_number(self, name, positive=False)
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
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_width(self) -> int:
        return self.ffn_hidden or 4 * self.n_embd

    @property
    def adapter_targets(self) -> tuple[str, ...]:
        """The modules LoRA adapts: the spec's, else the architecture's attention projections."""
        return self.lora_targets or DEFAULT_LORA_TARGETS

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step over all ranks and micro-batches."""
        return self.world_size * self.micro_batch * self.grad_accum * self.seq_len

    # ---- identity: the one definition of a case, its id and its scaling group ----------
    @property
    def run_as(self) -> str:
        """The strategy as run: ``fsdp``, ``fsdp+ac`` for a variant, ``qlora-fsdp+ac`` for a
        fine-tuning workload (the report's strategy label)."""
        return run_as(strategy=self.strategy, variant=self.variant, workload=self.workload)

    @property
    def case_id(self) -> str:
        """Readable id of the case, e.g. ``zero2-ws4-seq2048``, ``fsdp+ac-ws8-seq2048``,
        ``qlora-ddp-ws4-seq512``: the workload and variant only when they are not the default;
        ``collectives-ws8`` for the collectives probe."""
        return case_id(strategy=self.strategy, variant=self.variant, workload=self.workload,
                       world_size=self.world_size, seq_len=self.seq_len, benchmark=self.benchmark)

    def identity(self) -> str:
        """What makes two runs the same case: every field but the free-form ``extra`` labels and
        ``instruments`` (their steps come after the measured ones and change none of them). Runs
        with equal identities (on the same device) are trials of one case."""
        return self._key(IDENTITY_FREE)

    def differences(self, other: RunSpec) -> list[str]:
        """Where ``other`` is another case than this one, field by field (``micro_batch 8 -> 4``);
        empty when their identities are equal."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(a.keys() | b.keys())
                if k not in IDENTITY_FREE and a.get(k) != b.get(k)]

    def scaling_identity(self) -> str:
        """The case less what follows the world size (``scaling_free``): the cases with equal
        scaling identities share one scaling baseline and are projected together."""
        return self._key(scaling_free(self))

    def at_world_size(self, world_size: int, *, nnodes: int, micro_batch: int, grad_accum: int) -> RunSpec:
        """The same case at another world size: every other axis copied by construction (only the
        fields of ``scaling_free`` change; the caller gives the layout and batch split)."""
        changed = dict(world_size=world_size, nnodes=nnodes, micro_batch=micro_batch, grad_accum=grad_accum)
        if self.scaling == "weak" and (micro_batch, grad_accum) != (self.micro_batch, self.grad_accum):
            raise SpecError("micro_batch/grad_accum: weak scaling keeps the per-device batch")
        return self.replace(**changed)

    def _key(self, leave_out: frozenset[str]) -> str:
        return json.dumps({k: v for k, v in self.to_dict().items() if k not in leave_out}, sort_keys=True)

    def variant_parts(self) -> dict[str, int | None]:
        """The variant's parts, e.g. {"ac": None, "bucket": 100}; {} for "base"."""
        return parse_variant(self.variant)

    @property
    def precision(self) -> str:
        """How the run computes: "fp32"; "native", dtype bf16 as the strategy's users run it (its
        table row's ``bf16``: FSDP's bf16 parameters with fp32 reduction, DeepSpeed's bf16 section);
        or "autocast", torch.autocast over fp32 parameters: DDP's own bf16, the variant autocast
        (every strategy computing alike, for parity studies), and qlora (its packed NF4 weights
        live in fp32 containers, which a bf16 parameter cast would corrupt)."""
        if self.dtype != "bf16":
            return "fp32"
        row = strategies.get(self.strategy)
        if "autocast" in self.variant_parts() or self.workload == "qlora" or not row.bf16_payloads:
            return "autocast"
        return "native"

    def variant_problem(self) -> str | None:
        """Why this strategy, device or layout cannot run the variant, or None if it can."""
        strategy = strategies.get(self.strategy)
        if "autocast" in self.variant_parts() and self.dtype != "bf16":
            return "variant autocast sets how dtype bf16 is computed: the case's dtype is fp32"
        if "compile" in self.variant_parts() and self.workload == "qlora":
            return strategies.COMPILE_QLORA
        for name in self.variant_parts():
            problem = strategy.problem(name, self.device) or VARIANTS[name].problem(self.device, self.nnodes)
            if problem:
                return problem
        return None

    def depth_problem(self) -> str | None:
        """Why this variant does nothing at this depth (``ac-every<K>`` past the model's blocks), or None.
        Asked where a user's case or plan enters (cases.make_spec, llmbench-plan, python -m harness), not
        here in __post_init__: the planner measures depth-truncated copies of a spec on purpose."""
        every = self.variant_parts().get("ac-every")
        if every and every > self.n_layer:
            return (f"variant: ac-every{every} checkpoints every {every}th block, and the model has "
                    f"{self.n_layer}: no block would be checkpointed (use ac-every1..{self.n_layer})")
        return None

    def workload_problem(self) -> str | None:
        """Why this model or strategy cannot run the workload, or None if it can."""
        if self.workload != "pretrain" and self.arch == "gpt":
            return (f"workload {self.workload} fine-tunes a Hugging Face architecture (the llama, mistral "
                    f"and qwen2 presets, e.g. tiny-mistral); model {self.model!r} is the GPT pre-training "
                    f"model")
        return strategies.get(self.strategy).problem(self.workload, self.device)

    def problem(self) -> str | None:
        """Why this case cannot run as specified (variant or workload), or None if it can."""
        return self.variant_problem() or self.workload_problem()

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    # ---- JSON -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        data["lora_targets"] = list(self.lora_targets)
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
        for old, name in OLD_INSTRUMENT_FIELDS.items():
            steps = data.pop(old, 0) if version in (5, 6) else 0
            if steps:
                data["instruments"] = {**data.get("instruments", {}), name: steps}
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
