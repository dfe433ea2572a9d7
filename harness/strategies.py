"""The strategy table: every fact about a training strategy and its variants, in one place.

Standard library only: the harness, the spec, the planner and the report all read it. A name not in
the table is an error everywhere (``get``), never a fallback to another strategy's numbers.

Adding a strategy is a row plus its engine module (``build(model, spec, device) -> (engine,
config)``, see harness/parallel/); the row's ``memory`` names the memory planner's formulas it follows
(MEMORY), or leaves it "not planned". Built-in rows are below; a package adds its own through the
entry-point group ``pytest_llmbench.strategies``, or a module named in the ``LLMBENCH_STRATEGIES``
environment variable (comma-separated module names, also read by every rank), either of which
calls ``register``.

What each strategy sends per optimizer step with m micro-batches, as measured (harness/traffic.py
records every collective of a step; tests/harness/test_traffic.py holds each row to it at ws2 and
ws4, per variant). Payloads are named in harness/shapes.py (``payloads``): grads are fp32 (bf16
with bf16-reduce), parameters fp32. Every message keeps its size at any N (up to padding to a
multiple of N; measured equal at ws2 and ws4): only the bus factor of its op changes with N.
LoRA/QLoRA follow the same rows with their own payloads (gradients of the adapters only, except
FSDP1's unit_grads; qlora's weights gathered packed, 0.5 B each).
    ddp     all_reduce(grads) once per step (no_sync on the first m-1 micro-batches), in buckets
    zero2   all_reduce(grads) every micro-batch, not a reduce_scatter: DeepSpeed 0.19's default
            use_multi_rank_bucket_allreduce all-reduces each bucket and keeps its partition;
            all_gather(params) once, after the optimizer step
    fsdp    all_gather(params) in forward and all_gather(blocks) in backward per micro-batch (the
            root is kept unsharded after forward, harness/parallel/fsdp.py; noreshard: params only);
            reduce_scatter(grads) once per step (no_sync keeps the unsharded grads)
    fsdp1   all_gather(params) in forward and all_gather(blocks) in backward per micro-batch (its
            root unit is not resharded after forward); noreshard: all_gather(params) once per step
            (SHARD_GRAD_OP under no_sync keeps the parameters gathered across micro-batches);
            reduce_scatter(unit_grads) once per step: its flat parameters whole, frozen weights too
    zero3   all_gather(zero3_sharded) per micro-batch, all_gather(zero3_regathered) again in
            backward, all_gather(zero3_persistent) once per step; reduce_scatter(grads) every
            micro-batch
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

from harness.recompute import PARTS as RECOMPUTE
from harness.variants import VARIANTS, Variant  # noqa: F401 (Variant: a plugin row's type)

PLUGIN_ENV = "LLMBENCH_STRATEGIES"
ENTRY_POINT_GROUP = "pytest_llmbench.strategies"
SHARDABLE = frozenset({"params", "grads", "optimizer"})
PAYLOADS = ("grads", "params", "trainable", "blocks", "unit_grads", "zero3_sharded", "zero3_persistent",
            "zero3_regathered")
PER = ("micro_batch", "step")
# The memory planner's built-in formulas a row can declare (planner/families.py, each term with
# the line of the strategy's own code that allocates it): a full replica per rank as DDP keeps it; DeepSpeed's
# ZeRO-2 and ZeRO-3 partitions; every parameter a shard, as FSDP2 and FSDP1 keep them. A row that
# declares none is "not planned", never planned with another strategy's numbers. A package registers
# more families with the planner (families.register); a row naming one the planner lacks is not planned.
MEMORY = ("replicated", "zero2", "zero3", "sharded")
# How PyTorch's memory tracker follows a row's engine (harness/instruments/memory.py, and the planner's
# references, planner/memref.py): "module", MemTracker over the wrapped module and its optimizer (any
# engine of plain tensors); "fsdp2", FSDPMemTracker, which also splits sharded from unsharded state.
TRACKERS = ("module", "fsdp2")
COMPILES = ("model", "blocks")  # what variant compile compiles (the row's ``compiles``)
REPLICA = "ddp"  # the plain replicated row: activations are measured on it, traffic stated against it


class StrategyError(ValueError):
    """An unknown strategy or a malformed table row; the message names it."""


@dataclass(frozen=True)
class Send:
    """One collective of a step: ``op`` on ``payload`` (one of PAYLOADS, sized by
    harness/shapes.py ``payloads``), ``times`` per ``per`` (micro_batch or step)."""

    op: str
    payload: str
    per: str
    times: int = 1

    def __post_init__(self) -> None:
        if self.payload not in PAYLOADS or self.per not in PER or self.times < 1:
            raise StrategyError(f"Send({self.op!r}, {self.payload!r}, {self.per!r}, {self.times}): payload "
                                f"is one of {PAYLOADS}, per one of {PER}, times >= 1")

    def count(self, micro_batches: int) -> int:
        return self.times * (micro_batches if self.per == "micro_batch" else 1)


@dataclass(frozen=True)
class Strategy:
    """One row of the table. ``shards``: what each rank holds a 1/N shard of (params, grads,
    optimizer); ``by_variant``: a variant that changes the shards or the sends, e.g. noreshard;
    ``rules``: (variant or workload, device, why) combinations that are a skip for this strategy."""

    name: str
    engine: str  # the module whose build(model, spec, device) wraps the model
    doc: str
    color: str
    shards: frozenset[str]
    sends: tuple[Send, ...]
    variants: frozenset[str]
    by_variant: dict[str, tuple[frozenset[str], tuple[Send, ...]]] = field(default_factory=dict)
    rules: tuple[tuple[str, str, str], ...] = ()
    engine_options: dict[str, object] = field(default_factory=dict)
    # dtype bf16 as the strategy's users run it (RunSpec.precision "native"), and the payloads it
    # then sends in bf16 (harness/shapes.py halves them); empty: torch.autocast, fp32 parameters
    bf16: str = "torch.autocast(bf16), fp32 parameters, gradients and reduction"
    bf16_payloads: frozenset[str] = frozenset()
    memory: str | None = None  # MEMORY: the planner's formulas for this row; None: not planned
    tracker: str = "module"  # TRACKERS: how PyTorch's memory tracker follows the engine
    untracked: str = ""  # why the memory tracker cannot follow the engine at all (then no tracker runs)
    # what the engine's optimizer made at initialize, before any tracker starts: name -> the attribute of
    # DeepSpeed's ZeRO optimizer holding it, counted in this order, a storage once (the memory instrument
    # hands them to the tracker as held bytes; deepspeed/runtime/zero/stage_1_and_2.py, stage3.py)
    held: dict[str, str] = field(default_factory=dict)
    # the independent peak ``llmbench-plan --check`` holds the planner to: (its name, the function of
    # planner/memref.py that runs it on this row's real engine at any N); () where none runs it
    reference: tuple[str, str] = ()
    # what variant compile compiles (harness/compiled.py): "model", the engine's model whole; "blocks", each
    # transformer block, the root eager (FSDP2 as torchtitan). The step-time predictor fuses only that.
    compiles: str = "model"
    # variants the step-time predictor times though the harness does not run them: variant -> why not run
    timed_only: dict[str, str] = field(default_factory=dict)
    # the rule of harness/bookkeeping.py that states the memory traffic of the engine's own code; "": none
    bookkeeping: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or any(c.isspace() for c in self.name):
            raise StrategyError(f"strategy name {self.name!r}: a non-empty word (no spaces or '/')")
        unknown = (set(self.variants) | set(self.by_variant) | set(self.timed_only)) - set(VARIANTS)
        if unknown or not self.shards <= SHARDABLE:
            raise StrategyError(f"strategy {self.name!r}: unknown variant(s) {sorted(unknown)} or shards "
                                f"{sorted(self.shards - SHARDABLE)} (shards are {sorted(SHARDABLE)})")
        if self.memory is not None and (not self.memory or any(c.isspace() for c in self.memory)):
            raise StrategyError(f"strategy {self.name!r}: memory {self.memory!r} is not a family name (built "
                                f"in: {', '.join(MEMORY)}; a package registers more; None: not planned)")
        if self.tracker not in TRACKERS or self.compiles not in COMPILES or (self.reference and
                                                                             len(self.reference) != 2):
            raise StrategyError(f"strategy {self.name!r}: tracker {self.tracker!r} is not one of "
                                f"{', '.join(TRACKERS)}, compiles {self.compiles!r} not one of {COMPILES}, "
                                f"or reference {self.reference!r} is not (name, function)")

    def sharded(self, what: str, variant_parts: frozenset[str] | set[str] = frozenset()) -> bool:
        """Whether each rank holds a 1/N shard of ``what`` (params, grads, optimizer) under the variant:
        the row's fact that the planner, the step-time predictor and the report read."""
        if what not in SHARDABLE:
            raise StrategyError(f"sharded({what!r}): one of {', '.join(sorted(SHARDABLE))}")
        return what in self.layout(variant_parts)[0]

    def not_planned(self) -> str | None:
        """Why the memory planner has no figure for this row, or None."""
        if self.memory is None:
            return f"not planned: {self.name} declares no memory terms (its row's memory is None)"
        return None

    def layout(self, variant_parts: frozenset[str] | set[str]) -> tuple[frozenset[str], tuple[Send, ...]]:
        """(what is sharded, what is sent) under the variant's parts."""
        for part, layout in self.by_variant.items():
            if part in variant_parts:
                return layout
        return self.shards, self.sends

    def stated_bytes(self, variant_parts: frozenset[str] | set[str], payloads: dict[str, float],
                     micro_batches: int) -> dict[str, float]:
        """Bytes of the whole arrays per op over one step, by the row's formula (``payloads``:
        harness/shapes.py): what the measured traffic of the step must equal."""
        out: dict[str, float] = {}
        for send in self.layout(variant_parts)[1]:
            out[send.op] = out.get(send.op, 0.0) + send.count(micro_batches) * payloads[send.payload]
        return out

    def stated_calls(self, variant_parts: frozenset[str] | set[str], micro_batches: int) -> dict[str, int]:
        """Collectives per op over one step, by the row's formula (each over the whole model)."""
        out: dict[str, int] = {}
        for send in self.layout(variant_parts)[1]:
            out[send.op] = out.get(send.op, 0) + send.count(micro_batches)
        return out

    def problem(self, what: str, device: str) -> str | None:
        """Why this strategy cannot run variant part or workload ``what`` on ``device``, or None."""
        if what in VARIANTS and what not in self.variants:
            why = self.timed_only.get(what) or VARIANTS[what].why_not
            return f"variant {what} does not apply to {self.name}: {why}"
        return next((why for name, dev, why in self.rules if name == what and dev == device), None)


COMPILE_QLORA = ("variant compile with qlora: bitsandbytes' 4-bit layers are not compiled here (never run "
                 "eager under the compiled name)")
QLORA_FSDP2_GPU = (
    "qlora under FSDP2 (fully_shard) on GPU: bitsandbytes issue #1945 reports the packed NF4 weights "
    "corrupted (open); not run until verified on a GPU. On CPU/gloo it follows DDP's loss curve "
    "(tests/harness/test_workloads.py); use fsdp1, zero2 or zero3 for GPU qlora")
FSDP_NORESHARD = (frozenset({"grads", "optimizer"}), (Send("all_gather", "params", "micro_batch"),
                                                      Send("reduce_scatter", "grads", "step")))
FSDP1_NORESHARD = (frozenset({"grads", "optimizer"}), (Send("all_gather", "params", "step"),
                                                       Send("reduce_scatter", "unit_grads", "step")))
DEEPSPEED_BF16 = ("DeepSpeed's bf16 section: bf16 parameters, gradients and communication, an fp32 master "
                  "partition for the optimizer")
BUILTIN = (
    Strategy("ddp", "harness.parallel.ddp", "torch DistributedDataParallel: a full replica per rank",
             "#1f77b4", frozenset(), (Send("all_reduce", "grads", "step"),),
             variants=frozenset({*RECOMPUTE, "compile", "bf16-reduce", "powersgd", "bucket"}),
             rules=(("bf16-reduce", "cpu", "variant bf16-reduce on ddp is torch's bf16_compress_hook, which "
                     "torch refuses on gloo (it requires CUDA 11+ and NCCL 2.10+)"),), memory="replicated",
             bookkeeping="ddp_reducer"),
    Strategy("fsdp", "harness.parallel.fsdp", "FSDP2 fully_shard per transformer block and the root",
             "#2ca02c", SHARDABLE, (Send("all_gather", "params", "micro_batch"),
                                    Send("all_gather", "blocks", "micro_batch"),
                                    Send("reduce_scatter", "grads", "step")),
             variants=frozenset({*RECOMPUTE, "compile", "offload", "bf16-reduce", "noreshard", "hsdp",
                                 "autocast"}),
             by_variant={"noreshard": FSDP_NORESHARD},
             rules=(("qlora", "cuda", QLORA_FSDP2_GPU),),
             bf16="MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): bf16 gathers and compute, "
                  "fp32 shards and gradient reduction (torchtitan's)",
             bf16_payloads=frozenset({"params", "blocks"}), memory="sharded", tracker="fsdp2",
             reference=("FSDPMemTracker", "fsdp_peak"), compiles="blocks", bookkeeping="fully_shard"),
    Strategy("fsdp1", "harness.parallel.fsdp1", "classic FullyShardedDataParallel with a transformer-block "
             "wrap policy", "#98df8a", SHARDABLE, (Send("all_gather", "params", "micro_batch"),
                                                   Send("all_gather", "blocks", "micro_batch"),
                                                   Send("reduce_scatter", "unit_grads", "step")),
             variants=frozenset({*RECOMPUTE, "compile", "offload", "bf16-reduce", "noreshard", "autocast"}),
             by_variant={"noreshard": FSDP1_NORESHARD},
             bf16="MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=bf16): bf16 gathers "
                  "and compute, fp32 shards and gradient reduction",
             bf16_payloads=frozenset({"params", "blocks"}), memory="sharded",
             untracked="classic FSDP is not tracked: its parameters are views of a flat parameter, and "
                       "MemTracker's gradient hooks refuse non-leaf tensors",
             timed_only={"hsdp": "HYBRID_SHARD (shard in the node, all-reduce across nodes) is timed, not "
                                 "run: on two CPU nodes it left DDP's loss curve by 5%"},
             bookkeeping="flat_param"),
    Strategy("zero2", "harness.parallel.deepspeed", "DeepSpeed ZeRO stage 2", "#d62728",
             frozenset({"grads", "optimizer"}), (Send("all_reduce", "grads", "micro_batch"),
                                                 Send("all_gather", "trainable", "step")),
             variants=frozenset({*RECOMPUTE, "compile", "offload", "bf16-reduce", "bucket", "autocast"}),
             engine_options={"zero_stage": 2}, bf16=DEEPSPEED_BF16,
             bf16_payloads=frozenset({"grads", "trainable"}), memory="zero2",
             held={"master_copy": "single_partition_of_fp32_groups"},
             reference=("DeepSpeed engine", "deepspeed_peak"), bookkeeping="deepspeed_stage2"),
    Strategy("zero3", "harness.parallel.deepspeed", "DeepSpeed ZeRO stage 3", "#ff7f0e", SHARDABLE,
             (Send("all_gather", "zero3_sharded", "micro_batch"),
              Send("all_gather", "zero3_regathered", "micro_batch"),
              Send("all_gather", "zero3_persistent", "step"), Send("reduce_scatter", "grads", "micro_batch")),
             variants=frozenset({*RECOMPUTE, "compile", "offload", "bf16-reduce", "bucket", "autocast"}),
             engine_options={"zero_stage": 3}, bf16=DEEPSPEED_BF16,
             bf16_payloads=frozenset({"grads", "zero3_sharded", "zero3_persistent", "zero3_regathered"}),
             memory="zero3", held={"weight_shard": "fp16_partitioned_groups_flat",
                                   "master_copy": "fp32_partitioned_groups_flat",
                                   "gradient_partition": "grad_partitions_flat_buffer"},
             reference=("DeepSpeed engine", "deepspeed_peak"), bookkeeping="deepspeed_stage3"),
)
_TABLE: dict[str, Strategy] = {s.name: s for s in BUILTIN}
_plugins_loaded = False


def register(strategy: Strategy) -> Strategy:
    """Add a row (a plugin's strategy). The same row twice is harmless; another row under a name
    already taken is an error."""
    known = _TABLE.get(strategy.name)
    if known is not None and known != strategy:
        raise StrategyError(f"strategy {strategy.name!r} is already registered with another row")
    _TABLE[strategy.name] = strategy
    return strategy


def names() -> tuple[str, ...]:
    """Every known strategy: the built-in ones, then the plugins'."""
    _load_plugins()
    return tuple(_TABLE)


def find(name: str) -> Strategy | None:
    """The row of ``name``, or None: for stored results, whose strategy may be a plugin's that this
    process does not have ("not in this table"; a case to run still uses ``get``)."""
    _load_plugins()
    return _TABLE.get(name) if isinstance(name, str) else None


def get(name: str) -> Strategy:
    """The row of ``name``; StrategyError naming the known ones if there is none."""
    _load_plugins()
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise StrategyError(f"unknown strategy {name!r}; known: {', '.join(_TABLE)}") from None


def _load_plugins() -> None:
    """Import the modules of ``LLMBENCH_STRATEGIES`` and the entry points (once); each registers rows."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    import_plugins(PLUGIN_ENV, ENTRY_POINT_GROUP, StrategyError)


def import_plugins(env: str, group: str, error: type[Exception]) -> None:
    """Import the modules named in the environment variable ``env`` (comma-separated) and load the
    entry points of ``group``: a plugin's module registers its rows on import (strategies here,
    harness/instruments' too). A module that cannot be imported is ``error`` naming the variable."""
    for module in [m.strip() for m in os.environ.get(env, "").split(",") if m.strip()]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise error(f"environment {env}: cannot import {module!r}: {exc}") from None
    from importlib.metadata import entry_points

    for point in entry_points(group=group):
        point.load()
