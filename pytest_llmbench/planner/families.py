"""The memory planner's formulas, one family per row of ``FAMILIES``: what a strategy keeps on each
device at the two moments of a step (planner/memory.py's docstring says why those two). A strategy row
names its family (``harness/strategies.py``: the row's ``memory``); a package adds a family with
``register`` and a row that names it (tests/plugin/test_plan_extension.py). A row whose family is
not registered here is not planned, never planned with another family's numbers.

    replicated  a full replica per rank, as DDP keeps it
    zero2       DeepSpeed ZeRO-2: gradients and optimizer state partitioned, weights replicated
    zero3       DeepSpeed ZeRO-3: weights partitioned too, gathered up to stage3_max_live_parameters
    sharded     every parameter a shard, as FSDP2 and FSDP1 keep them
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_llmbench.planner.terms import Shape, Term

# harness/configs/zero{2,3}.json and DeepSpeed's defaults for what they leave out
ZERO_REDUCE_BUCKET = 50_000_000
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class Step:
    """What a family's formulas are asked about: the shape, N, micro-batches, the bytes of a trainable
    weight (4 fp32, 2 bf16), the variant parts, the reduce bucket in MiB (None: the default), whether
    the figure is a host's resident set, and AdamW's foreach."""

    shape: Shape
    n: int
    m: int
    w: int
    parts: frozenset[str]
    bucket_mb: int | None
    resident: bool
    foreach: bool


@dataclass(frozen=True)
class Family:
    """``moments``: (terms alive at the activation peak, terms alive at the optimizer step), activations
    aside. ``end_of_backward``: the terms alive at the end of backward given the peak's and the
    activations there, where the family gains there (None: it does not). ``estimator_extra``: what
    DeepSpeed's model-state estimator adds beyond the family's state (memory.deepspeed_counted)."""

    moments: Callable[[Step], tuple[list[Term], list[Term]]]
    end_of_backward: Callable[[Step, list[Term], Term], list[Term]] | None = None
    estimator_extra: Callable[[Shape], float] = lambda shape: 0.0


def _optimizer(pt: int, n: int) -> Term:
    return Term("optimizer", 8.0 * pt / n, "AdamW moments 8 B x P_t" + ("" if n == 1 else " / N"))


def _replicated(x: Step) -> tuple[list[Term], list[Term]]:
    """DDP: a replica per rank; fp32 weights under autocast."""
    s, pt = x.shape, x.shape.trainable
    step = _step_temporaries(x.foreach, s.largest_group, s.largest_trainable, "")
    weights_t = Term("weights", s.weight_bytes_fp32, "W (fp32 under autocast)")
    bucket = Term("grad buckets", 4.0 * pt, "4 B x P_t (reducer buckets, gradient_as_bucket_view=False)")
    grads = Term("gradients", 4.0 * pt, "4 B x P_t")
    opt = _optimizer(pt, 1)
    accumulated = [grads] if x.m > 1 else []
    return [weights_t, opt, bucket, *accumulated], [weights_t, opt, bucket, grads, step]


def _zero_common(x: Step, stage: int) -> tuple[Term, Term, Term, Term, float]:
    """(optimizer, the step's flat gradient copy, the master partition, the step's temporaries, the
    weights' bytes): what ZeRO-2 and ZeRO-3 share. The client AdamW steps one flat fp32 partition a group;
    the step flattens the partition's gradients and casts them to fp32 (stage_1_and_2.py step,
    stage3.py _prepare_fp32_grad_for_sub_group): a copy beside the buffer they live in."""
    s, n, pt = x.shape, x.n, x.shape.trainable
    part = -(-s.largest_group // n)
    step = _step_temporaries(x.foreach, part, part, "/ N (one flat partition)")
    flat = Term("flat gradient copy", 4.0 * pt / n, "fp32 4 B x P_t / N (flattened at the step)")
    master = Term("master copy", 4.0 * pt / n, "fp32 partition 4 B x P_t / N"
                  + (" (a clone even of fp32)" if stage == 3 else ""))
    weights = s.weight_bytes_fp32 if x.w == 4 else s.weight_bytes_16
    return _optimizer(pt, n), flat, master, step, weights


def _zero2(x: Step) -> tuple[list[Term], list[Term]]:
    """DeepSpeed ZeRO-2: weights replicated, gradients and optimizer state partitioned."""
    s, w = x.shape, x.w
    opt, flat, master, step, weights = _zero_common(x, 2)
    weights_t = Term("weights", weights, f"W ({'fp32' if w == 4 else '16-bit'}, replicated)")
    grads = Term("gradients", float(w * s.zero2_gradient_buffer(x.n)),
                 f"{w} B x every tensor the partition touches, whole (>= P_t / N)")
    # autograd's gradient of the largest tensor before the hook copies it into a bucket, beside
    # the activations. Where the plain model keeps it in .grad it is not in the measured
    # activations; a tied embedding's gradient waits in autograd for its second half, as a
    # temporary the activations already hold (at the end of backward its two halves and
    # their sum, 3x, which the measurement holds too)
    flight = Term("gradients in flight", 0.0 if s.tied else float(w * s.largest_trainable),
                  f"{w} B x largest tensor (none apart when tied: in the activations)", state=False)
    # with m > 1 the earlier micro-batches' buffer stays (all_grad_tensors) while the last
    # one's fills; at the step one is left
    next_one = Term("gradients", grads.bytes, "the next micro-batch's buffer (grad_accum > 1)")
    filling = [next_one] if x.m > 1 else []
    held = [weights_t, master, opt, grads]
    # the buckets are released at the end of backward (_release_ipg_buffers)
    return [*held, *filling, zero_buckets(2, x), flight], [*held, flat, step]


def _zero3(x: Step) -> tuple[list[Term], list[Term]]:
    """DeepSpeed ZeRO-3: every state a partition; parameters gathered as they are used."""
    s, w = x.shape, x.w
    opt, flat, master, step, weights = _zero_common(x, 3)
    weights_t = Term("weights", weights / x.n, "W / N (shard)")
    grads = Term("gradients", w * s.trainable / x.n, f"{w} B x P_t / N (partition, grad_accum_dtype = the "
                 f"weights')")
    live = min(ZERO3_MAX_LIVE_PARAMETERS, s.params)
    gathered = Term("gathered", w * max(s.largest_layer, live),
                    "w x min(stage3_max_live_parameters, P) (at least the largest layer)")
    held = [weights_t, master, opt, grads, zero_buckets(3, x)]
    return [*held, gathered], [*held, flat, step]


def _zero3_end(x: Step, backward: list[Term], act: Term) -> list[Term]:
    """ZeRO-3 at the end of backward: a reduce bucket's gradients beside the partition (grad_accum > 1)."""
    bucket = zero_buckets(3, Step(x.shape, x.n, x.m, x.w, x.parts, x.bucket_mb, False, x.foreach))
    held = [Term("gradients", bucket.bytes, "a reduce bucket's gradients beside the partition "
                 "(grad_accum > 1, DeepSpeed's engine)")] if x.m > 1 else []
    return [*backward, *held, act]


def _sharded(x: Step) -> tuple[list[Term], list[Term]]:
    """FSDP2 and FSDP1: every parameter a shard; the root and two blocks gathered (noreshard: all)."""
    s, n, w, pt = x.shape, x.n, x.w, x.shape.trainable
    every = "noreshard" in x.parts
    step = _step_temporaries(x.foreach, s.largest_group / n, s.largest_trainable / n, "/ N (shards)")
    weights_t = Term("weights", s.weight_bytes_fp32 / n, "W / N (fp32 shard)")
    opt = _optimizer(pt, n)
    gathered = Term("gathered", w * (s.root + (s.n_layer if every else 2) * s.block) if n > 1 else 0.0,
                    f"w x (root unit + {'every block' if every else 'two blocks'})")
    reducing = Term("grad buckets", 4.0 * s.block if n > 1 else 0.0, "4 B x one block (reduce-scatter input)")
    unsharded = [Term("gradients", 4.0 * pt, "4 B x P_t unsharded (no_sync accumulation)")] if x.m > 1 else []
    shard = Term("gradients", 4.0 * pt / n, "4 B x P_t / N (shard)")
    return ([weights_t, opt, gathered, reducing, *unsharded], [weights_t, opt, shard, step])


def _sharded_end(x: Step, backward: list[Term], act: Term) -> list[Term]:
    """FSDP at the end of backward: the L - 1 blocks already reduce-scattered hold shards; with m > 1 a
    reduced block's unsharded gradient is freed: the root's and the first block's stay."""
    s = x.shape
    blocks_t = s.trainable * (s.block * s.n_layer / s.params) if s.params else 0.0
    done = blocks_t * (s.n_layer - 1) / s.n_layer
    reduced = Term("gradient shards", 4.0 * done / x.n, "4 B x the P_t of the L - 1 blocks already "
                   "reduce-scattered / N")
    kept = [t if not t.formula.startswith("4 B x P_t unsharded") else
            Term("gradients", 4.0 * (s.trainable - done), "4 B x P_t unsharded, less the reduced blocks'")
            for t in backward]
    return [*kept, reduced, act]


def _step_temporaries(foreach: bool, elements: float, largest: float, per: str) -> Term:
    """AdamW's temporaries in its step (torch/optim/adam.py): foreach makes sqrt(v) of every tensor
    of a group at once, one fp32 list (the group of matrices, the larger, sets the peak); the
    for-loop makes sqrt(v) and its quotient for one tensor at a time, the largest one setting it."""
    if foreach:
        return Term("optimizer step", 4.0 * elements, f"AdamW foreach sqrt(v): 4 B x the larger group "
                    f"{per}".strip(), state=False)
    return Term("optimizer step", 8.0 * largest, f"AdamW for-loop sqrt(v) and quotient: 2 x 4 B x largest "
                f"tensor {per}".strip(), state=False)


def zero_buckets(stage: int, x: Step) -> Term:
    """DeepSpeed's reduce buckets: ZeRO-2 two (overlap_comm, harness/configs/zero2.json), ZeRO-3
    one, each of reduce_bucket_size elements of the gradients' dtype; on a host's resident set,
    only as much of them as the gradients fill."""
    count = 2 if stage == 2 else 1
    elements = x.bucket_mb * 2**20 // 4 if x.bucket_mb else ZERO_REDUCE_BUCKET
    what = f"{count} reduce bucket{'s' if count > 1 else ''} x reduce_bucket_size"
    if x.resident:
        return Term("grad buckets", float(x.w * min(count * elements, x.shape.trainable)),
                    f"min({what}, P_t) x w (pages written)")
    return Term("grad buckets", float(x.w * count * elements), f"{what} x w (allocated whole)")


FAMILIES: dict[str, Family] = {
    "replicated": Family(_replicated),
    "zero2": Family(_zero2),
    "zero3": Family(_zero3, _zero3_end, estimator_extra=lambda shape: 4.0 * shape.largest_layer),
    "sharded": Family(_sharded, _sharded_end),
}


def register(name: str, family: Family) -> Family:
    """Add a family a strategy row may name (a package's own engine with memory of its own)."""
    if not name or name in FAMILIES:
        raise ValueError(f"memory family {name!r}: a new non-empty name (known: {', '.join(FAMILIES)})")
    FAMILIES[name] = family
    return family
