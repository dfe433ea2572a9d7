"""The memory planner: per-device bytes of a training step, by named term, for a model nobody ran
here, at any world size. Estimated, never measured; standard library only (the report runs it).

Every term is a tensor the strategy's own code allocates, with the source that allocates it. The
peak is the larger of two moments of the last micro-batch of a step:

    backward   the model's activation peak (early in backward, the loss's gradients alive) on top
               of what persists: weights, optimizer state, the strategy's buffers, gradients
               accumulated by the earlier micro-batches, and what FSDP/ZeRO-3 hold gathered
    optimizer  activations gone, every gradient of the step present

and, given the activations alive at the end of backward (``end_activations``: the root and the first
block, measured on the model at depth 1), a third for FSDP and ZeRO-3 at N > 1, which a small model
peaks at (its embedding's gradient outweighs its blocks' activations):

    end of backward  what persists, as in backward; the activations of the root and the first block;
                     FSDP: the gradient shards of the L - 1 blocks already reduce-scattered, 4 B x their
                     P_t / N; ZeRO-3 with m > 1: a reduce bucket's gradients beside the partition
                     (DeepSpeed's engine holds them there at m > 1: measured, tests/harness/test_memref.py)

With P parameters, P_t trainable, N ranks, m micro-batches, w the bytes of a weight (4 fp32, 2 in
16-bit training) and AdamW (two fp32 moments, 8 B per trainable parameter):

    ddp     weights W, optimizer 8P_t, the reducer's buckets 4P_t (gradient_as_bucket_view=False,
            torch's default: a second copy of every gradient), gradients 4P_t (from the first
            micro-batch on when m > 1, no_sync accumulates them in .grad)
    zero2   weights W; per partition (stage_1_and_2.py): fp32 master copy 4P_t/N (a clone even of
            fp32 weights), optimizer 8P_t/N, a gradient buffer of w x every tensor the rank's
            partition touches, whole (copy_grads_in_partition: at least P_t/N, well above it once
            a tensor outgrows a partition); in backward two reduce buckets (setup_buckets: buf_0,
            and buf_1 for overlap_comm) of reduce_bucket_size elements each, allocated whole
            whatever the model's size and released at the end of backward, a second gradient
            buffer when m > 1 (all_grad_tensors keeps the earlier micro-batches'), and an untied
            head's gradient before the hook copies it (a tied one waits in autograd as a
            temporary, which the measured activations hold); at the step a flat fp32 copy of the
            partition's gradients 4P_t/N
    zero3   weight shard W/N; fp32 master 4P_t/N (_create_fp32_partitions means to reuse an fp32
            shard, but compares torch.device to the accelerator's device name, a str, which is
            never equal: a clone, measured); gradient partition wP_t/N (grad_accum_dtype: the
            weights'), optimizer 8P_t/N; one reduce bucket of reduce_bucket_size elements (stage3.py
            __init__, per gradient dtype), allocated whole, kept; gathered: the largest layer
            (DeepSpeed's estimator) or, with DeepSpeed's default stage3_max_live_parameters = 1e9
            and max_reuse_distance = 1e9, up to that many parameters kept gathered between forward
            and backward; at the step the flat fp32 copy 4P_t/N (_prepare_fp32_grad_for_sub_group)
    fsdp    weight shard W/N, optimizer 8P_t/N; in backward the root unit (embeddings, head, final
    fsdp1   norm) stays unsharded from forward (harness/parallel/fsdp.py: reshard_after_forward=False), two
            blocks gathered (computing, prefetched) and one block's gradients being
            reduce-scattered; with m > 1 the unsharded gradients of every micro-batch but the last
            (set_requires_gradient_sync(False) / no_sync): 4P_t on every rank; gradient shard
            4P_t/N at the optimizer step. noreshard: every block stays gathered.

At the optimizer step every strategy adds AdamW's own temporaries (torch/optim/adam.py): with
foreach, torch's default for CUDA tensors, sqrt(v) of a whole group at once, 4 B x the larger group
(per rank: /N for ZeRO's flat partitions and FSDP's shards); with the for-loop, the default on CPU,
sqrt(v) and its quotient for one tensor at a time, 2 x 4 B x the largest tensor it updates.

Device memory or host RSS: a GPU's allocator holds every byte a tensor allocates, so the default
counts DeepSpeed's buckets whole (PyTorch's memory tracker sees the same: tests/harness). A CPU
run's peak is its resident set, which holds only the pages written; DeepSpeed's buckets are
``torch.empty`` and gradients fill them from the start, so with ``resident=True`` a bucket counts
the gradients it can receive: min(buckets x reduce_bucket_size, P_t) x w.

Activations are not a formula here: ``activations`` is the measured peak of the model's own
activations and temporaries for one micro-batch (planner/memref.py runs the real architecture under
FakeTensorMode), or the report's fit of measured cases.

Checked against references others wrote (tests/unit/test_plan.py, tests/harness/test_memref.py):
FSDP2 against PyTorch's FSDPMemTracker on the real architecture at that N; ZeRO-2/3 against
DeepSpeed's own engine at that N under PyTorch's MemTracker (both under FakeTensorMode, harness/
memref.py) and against DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs`` at the 16-bit
widths those assume; DDP's bucket copy against DDP's own logging data.
"""

from __future__ import annotations

from harness import strategies
from harness.spec import RunSpec
from harness.variants import VARIANTS
from pytest_llmbench.planner.terms import GIB, Estimate, Shape, Term

__all__ = ["GIB", "Estimate", "Shape", "Term", "estimate", "moments", "of_run", "fits_from", "sentence"]
PRECISIONS = ("fp32", "bf16")
DDP_BUCKET_MB = 25  # harness/parallel/ddp.py: torch's default bucket_cap_mb
# harness/configs/zero{2,3}.json and DeepSpeed's defaults for what they leave out
ZERO_REDUCE_BUCKET = 50_000_000
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000


MEASURED_ACTIVATIONS = "measured peak of one micro-batch"


def estimate(strategy: str, shape: Shape, world_size: int, *, grad_accum: int = 1, activations: float = 0.0,
             precision: str = "fp32", variant_parts: frozenset[str] = frozenset(),
             bucket_mb: int | None = None, extra: tuple[Term, ...] = (),
             resident: bool = False, foreach: bool = True,
             activation_source: str = MEASURED_ACTIVATIONS,
             end_activations: float | None = None) -> Estimate | None:
    """Per-device bytes at the peak of a step (the larger of ``moments``); None where state leaves
    the device (offload). ``resident``: a host's resident set (a CPU run's peak RSS), where an
    allocation counts the pages written, not its size (the module's docstring). ``foreach``:
    AdamW's implementation, torch's default on CUDA; False for its for-loop (CPU's default)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    # an unknown name is an error, a row without memory terms is not planned: never another's numbers
    if strategies.get(strategy).not_planned() or unplanned(variant_parts):
        return None
    a, b = moments(strategy, shape, world_size, grad_accum=grad_accum, activations=activations,
                   precision=precision, variant_parts=variant_parts, bucket_mb=bucket_mb, extra=extra,
                   resident=resident, foreach=foreach, activation_source=activation_source,
                   end_activations=end_activations)
    return a if a.total >= b.total else b


def moments(strategy: str, shape: Shape, world_size: int, *, grad_accum: int = 1, activations: float = 0.0,
            precision: str = "fp32", variant_parts: frozenset[str] = frozenset(),
            bucket_mb: int | None = None, extra: tuple[Term, ...] = (),
            resident: bool = False, foreach: bool = True,
            activation_source: str = MEASURED_ACTIVATIONS,
            end_activations: float | None = None) -> tuple[Estimate, Estimate]:
    """(the backward moment, the optimizer moment); ``extra`` terms (e.g. the runtime's own memory
    that a CPU peak RSS holds) are in both. With ``end_activations``, the backward moment is the larger
    of its start (``activations``) and its end (the module docstring)."""
    backward, optimizer = _moments(strategy, shape, world_size, grad_accum, precision, variant_parts,
                                   bucket_mb, resident, foreach)
    act = Term("activations", activations, activation_source, state=False)
    start = Estimate(strategy, world_size, grad_accum, precision, "backward", [*backward, act, *extra])
    late = _end_of_backward(strategy, shape, world_size, grad_accum, precision, variant_parts, bucket_mb,
                            end_activations, backward)
    if late is not None:
        end = Estimate(strategy, world_size, grad_accum, precision, "end of backward", [*late, *extra])
        start = end if end.total > start.total else start
    return start, Estimate(strategy, world_size, grad_accum, precision, "optimizer", [*optimizer, *extra])


def _end_of_backward(strategy: str, s: Shape, n: int, m: int, precision: str, parts: frozenset[str],
                     bucket_mb: int | None, end_activations: float | None,
                     backward: list[Term]) -> list[Term] | None:
    """The terms alive at the end of backward (the module docstring), from ``backward``'s, or None where
    the moment is not planned (no measured end activations, one rank, or a family that does not gain)."""
    family = strategies.get(strategy).memory
    if end_activations is None or n == 1 or family not in ("sharded", "zero3"):
        return None
    act = Term("activations", end_activations, "at the end of backward: the root and the first block "
               "(measured at depth 1)", state=False)
    if family == "sharded":
        blocks_t = s.trainable * (s.block * s.n_layer / s.params) if s.params else 0.0
        done = blocks_t * (s.n_layer - 1) / s.n_layer
        reduced = Term("gradient shards", 4.0 * done / n, "4 B x the P_t of the L - 1 blocks already "
                       "reduce-scattered / N")
        # with m > 1 a reduced block's unsharded gradient is freed: the root's and the first block's stay
        kept = [t if not t.formula.startswith("4 B x P_t unsharded") else
                Term("gradients", 4.0 * (s.trainable - done), "4 B x P_t unsharded, less the reduced blocks'")
                for t in backward]
        return [*kept, reduced, act]
    fp32 = precision == "fp32" or "autocast" in parts
    bucket = _zero_buckets(3, s.trainable, 4 if fp32 else 2, bucket_mb, False)
    held = [Term("gradients", bucket.bytes, "a reduce bucket's gradients beside the partition "
                 "(grad_accum > 1, DeepSpeed's engine)")] if m > 1 else []
    return [*backward, *held, act]


def of_run(spec: RunSpec, *, resident: bool = False) -> tuple[Estimate, Estimate] | None:
    """``moments`` of a run's own spec: its strategy, shape, N, grad_accum, precision (bf16 for the
    strategies' native mixed precision), variant and bucket size, AdamW as torch defaults on its device
    (foreach on CUDA, the for-loop on CPU); None where state leaves the device (offload)."""
    parts = spec.variant_parts()
    row = strategies.find(spec.strategy)  # a stored plugin strategy absent here: not in this table
    if unplanned(parts) or row is None or row.not_planned():
        return None
    return moments(spec.strategy, Shape.of(spec), spec.world_size, grad_accum=spec.grad_accum,
                   precision="bf16" if spec.precision == "native" else "fp32", variant_parts=frozenset(parts),
                   bucket_mb=parts.get("bucket"), resident=resident, foreach=spec.device != "cpu")


def _moments(strategy: str, s: Shape, n: int, m: int, precision: str, parts: frozenset[str],
             bucket_mb: int | None, resident: bool, foreach: bool) -> tuple[list[Term], list[Term]]:
    """(terms alive at the activation peak, terms alive at the optimizer step), activations aside, by
    the formulas the strategy's row names (harness/strategies.py MEMORY)."""
    family = strategies.get(strategy).memory
    if family is None:
        raise ValueError(strategies.get(strategy).not_planned())
    fp32 = precision == "fp32" or "autocast" in parts  # the variant autocast: fp32 parameters, as DDP
    w = 4 if fp32 else 2
    if family == "replicated":
        return _replicated(s, m, foreach)
    if family in ("zero2", "zero3"):
        buckets = _zero_buckets(2 if family == "zero2" else 3, s.trainable, w, bucket_mb, resident)
        weights = s.weight_bytes_fp32 if fp32 else s.weight_bytes_16
        return _zero(family, s, n, m, w, weights, buckets, foreach)
    return _sharded(s, n, m, w, "noreshard" in parts, foreach)


def _optimizer(pt: int, n: int) -> Term:
    return Term("optimizer", 8.0 * pt / n, "AdamW moments 8 B x P_t" + ("" if n == 1 else " / N"))


def _replicated(s: Shape, m: int, foreach: bool) -> tuple[list[Term], list[Term]]:
    """DDP: a replica per rank; fp32 weights under autocast."""
    pt = s.trainable
    step = _step_temporaries(foreach, s.largest_group, s.largest_trainable, "")
    weights_t = Term("weights", s.weight_bytes_fp32, "W (fp32 under autocast)")
    bucket = Term("grad buckets", 4.0 * pt, "4 B x P_t (reducer buckets, gradient_as_bucket_view=False)")
    grads = Term("gradients", 4.0 * pt, "4 B x P_t")
    opt = _optimizer(pt, 1)
    accumulated = [grads] if m > 1 else []
    return [weights_t, opt, bucket, *accumulated], [weights_t, opt, bucket, grads, step]


def _zero(family: str, s: Shape, n: int, m: int, w: int, weights: float, buckets: Term,
          foreach: bool) -> tuple[list[Term], list[Term]]:
    """DeepSpeed ZeRO-2 and ZeRO-3: the client AdamW steps one flat fp32 partition a group."""
    p, pt = s.params, s.trainable
    part = -(-s.largest_group // n)
    step = _step_temporaries(foreach, part, part, "/ N (one flat partition)")
    opt = _optimizer(pt, n)
    # the step flattens the partition's gradients and casts them to fp32 (stage_1_and_2.py step,
    # stage3.py _prepare_fp32_grad_for_sub_group): a copy beside the buffer they live in
    flat = Term("flat gradient copy", 4.0 * pt / n, "fp32 4 B x P_t / N (flattened at the step)")
    master = Term("master copy", 4.0 * pt / n, "fp32 partition 4 B x P_t / N"
                  + (" (a clone even of fp32)" if family == "zero3" else ""))
    if family == "zero2":
        weights_t = Term("weights", weights, f"W ({'fp32' if w == 4 else '16-bit'}, replicated)")
        grads = Term("gradients", float(w * s.zero2_gradient_buffer(n)),
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
        filling = [next_one] if m > 1 else []
        held = [weights_t, master, opt, grads]
        # the buckets are released at the end of backward (_release_ipg_buffers)
        return [*held, *filling, buckets, flight], [*held, flat, step]
    weights_t = Term("weights", weights / n, "W / N (shard)")
    grads = Term("gradients", w * pt / n, f"{w} B x P_t / N (partition, grad_accum_dtype = the weights')")
    live = min(ZERO3_MAX_LIVE_PARAMETERS, p)
    gathered = Term("gathered", w * max(s.largest_layer, live),
                    "w x min(stage3_max_live_parameters, P) (at least the largest layer)")
    held = [weights_t, master, opt, grads, buckets]
    return [*held, gathered], [*held, flat, step]


def _sharded(s: Shape, n: int, m: int, w: int, every: bool, foreach: bool) -> tuple[list[Term], list[Term]]:
    """FSDP2 and FSDP1: every parameter a shard; the root and two blocks gathered (noreshard: all)."""
    pt = s.trainable
    step = _step_temporaries(foreach, s.largest_group / n, s.largest_trainable / n, "/ N (shards)")
    weights_t = Term("weights", s.weight_bytes_fp32 / n, "W / N (fp32 shard)")
    opt = _optimizer(pt, n)
    gathered = Term("gathered", w * (s.root + (s.n_layer if every else 2) * s.block) if n > 1 else 0.0,
                    f"w x (root unit + {'every block' if every else 'two blocks'})")
    reducing = Term("grad buckets", 4.0 * s.block if n > 1 else 0.0, "4 B x one block (reduce-scatter input)")
    unsharded = [Term("gradients", 4.0 * pt, "4 B x P_t unsharded (no_sync accumulation)")] if m > 1 else []
    shard = Term("gradients", 4.0 * pt / n, "4 B x P_t / N (shard)")
    return ([weights_t, opt, gathered, reducing, *unsharded], [weights_t, opt, shard, step])


def _step_temporaries(foreach: bool, elements: float, largest: float, per: str) -> Term:
    """AdamW's temporaries in its step (torch/optim/adam.py): foreach makes sqrt(v) of every tensor
    of a group at once, one fp32 list (the group of matrices, the larger, sets the peak); the
    for-loop makes sqrt(v) and its quotient for one tensor at a time, the largest one setting it."""
    if foreach:
        return Term("optimizer step", 4.0 * elements, f"AdamW foreach sqrt(v): 4 B x the larger group "
                    f"{per}".strip(), state=False)
    return Term("optimizer step", 8.0 * largest, f"AdamW for-loop sqrt(v) and quotient: 2 x 4 B x largest "
                f"tensor {per}".strip(), state=False)


def _zero_buckets(stage: int, pt: int, w: int, bucket_mb: int | None, resident: bool) -> Term:
    """DeepSpeed's reduce buckets: ZeRO-2 two (overlap_comm, harness/configs/zero2.json), ZeRO-3
    one, each of reduce_bucket_size elements of the gradients' dtype; on a host's resident set,
    only as much of them as the gradients fill."""
    count = 2 if stage == 2 else 1
    elements = bucket_mb * 2**20 // 4 if bucket_mb else ZERO_REDUCE_BUCKET
    what = f"{count} reduce bucket{'s' if count > 1 else ''} x reduce_bucket_size"
    if resident:
        return Term("grad buckets", float(w * min(count * elements, pt)),
                    f"min({what}, P_t) x w (pages written)")
    return Term("grad buckets", float(w * count * elements), f"{what} x w (allocated whole)")


def deepspeed_counted(strategy: str, shape: Shape, world_size: int) -> tuple[float, float]:
    """The planner's zero2/zero3 model states at the 16-bit widths DeepSpeed's
    ``estimate_zero{2,3}_model_states_mem_needs`` assume, without the reduce buckets, gathered
    parameters and transients those leave out (zero3: plus the estimator's 4 B x largest layer):
    (outside the optimizer step, inside it, with the step's flat fp32 gradient copy). ZeRO-2's
    estimate, 2P + 18P/N, is the step's; ZeRO-3's 18P/N lies between 16P/N (shard, master,
    moments, gradient partition) and the step's 20P/N."""
    left_out = ("grad buckets", "gathered")  # the backward moment has no flat copy; the step has it
    outside, inside = (sum(t.bytes for t in moment.terms if t.state and t.name not in left_out)
                       for moment in moments(strategy, shape, world_size, precision="bf16"))
    family = strategies.get(strategy).memory  # the row's memory formula (strategies.MEMORY)
    largest = 4.0 * shape.largest_layer if family == "zero3" else 0.0
    return outside + largest, inside + largest


def fits_from(by_n: dict[int, Estimate], limit_bytes: float) -> int | None:
    """The smallest N from which the estimate fits in ``limit_bytes`` at every larger N listed."""
    sizes = sorted(by_n)
    fitting = [n for i, n in enumerate(sizes) if all(by_n[k].total <= limit_bytes for k in sizes[i:])]
    return fitting[0] if fitting else None


def sentence(strategy: str, by_n: dict[int, Estimate], limit_gib: float) -> str:
    """"<strategy> fits from N=k (estimated: terms)" or why not, naming the terms at that N."""
    start = fits_from(by_n, limit_gib * GIB)
    largest = max(by_n)
    at = by_n[start] if start else by_n[largest]
    verdict = (f"fits from N={start}" if start else f"does not fit at any N up to {largest}")
    return (f"{strategy} {verdict} (estimated at N={at.world_size}: {at.total / GIB:.1f} of "
            f"{limit_gib:.3g} GiB = {at.describe()})")


def unplanned(variant_parts) -> str:
    """Why no plan is made with these variant parts (their rows' ``unplanned``), or ""."""
    return "; ".join(VARIANTS[p].unplanned for p in variant_parts if p in VARIANTS and VARIANTS[p].unplanned)
