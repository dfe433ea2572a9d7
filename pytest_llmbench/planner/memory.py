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

from dataclasses import dataclass

from harness import strategies
from harness.spec import RunSpec
from harness.variants import VARIANTS
from pytest_llmbench.planner.families import (  # noqa: F401 (the bucket sizes: the references' too)
    FAMILIES,
    ZERO3_MAX_LIVE_PARAMETERS,
    ZERO_REDUCE_BUCKET,
    Family,
    Step,
)
from pytest_llmbench.planner.terms import GIB, Estimate, Shape, Term

__all__ = ["GIB", "Estimate", "Shape", "Term", "estimate", "moments", "of_run", "fits_from", "sentence"]
PRECISIONS = ("fp32", "bf16")
DDP_BUCKET_MB = 25  # harness/parallel/ddp.py: torch's default bucket_cap_mb
MEASURED_ACTIVATIONS = "measured peak of one micro-batch"


@dataclass(frozen=True)
class Request:
    """One question to the planner: ``strategy`` at ``n`` ranks, ``m`` micro-batches a step, what
    ``estimate`` and ``moments`` take as keywords (their docstrings)."""

    strategy: str
    shape: Shape
    n: int
    m: int = 1
    activations: float = 0.0
    precision: str = "fp32"
    parts: frozenset[str] = frozenset()
    bucket_mb: int | None = None
    extra: tuple[Term, ...] = ()
    resident: bool = False
    foreach: bool = True
    activation_source: str = MEASURED_ACTIVATIONS
    end_activations: float | None = None


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
    family, _ = family_of(strategy)
    if family is None or unplanned(variant_parts):
        return None
    a, b = _moments(family, Request(strategy, shape, world_size, grad_accum, activations, precision,
                                    frozenset(variant_parts), bucket_mb, extra, resident, foreach,
                                    activation_source, end_activations))
    return a if a.total >= b.total else b


def moments(strategy: str, shape: Shape, world_size: int, *, grad_accum: int = 1, activations: float = 0.0,
            precision: str = "fp32", variant_parts: frozenset[str] = frozenset(),
            bucket_mb: int | None = None, extra: tuple[Term, ...] = (),
            resident: bool = False, foreach: bool = True,
            activation_source: str = MEASURED_ACTIVATIONS,
            end_activations: float | None = None) -> tuple[Estimate, Estimate]:
    """(the backward moment, the optimizer moment); ``extra`` terms (e.g. the runtime's own memory
    that a CPU peak RSS holds) are in both. With ``end_activations``, the backward moment is the larger
    of its start (``activations``) and its end (the module docstring). Raises ValueError where the
    strategy is not planned."""
    family, why = family_of(strategy)
    if family is None:
        raise ValueError(why)
    return _moments(family, Request(strategy, shape, world_size, grad_accum, activations, precision,
                                    frozenset(variant_parts), bucket_mb, extra, resident, foreach,
                                    activation_source, end_activations))


def family_of(strategy: str) -> tuple[Family | None, str]:
    """The memory family the strategy's row names (planner/families.py), or None and why it is not
    planned: the row declares none, or names one no family is registered for. An unknown name raises
    (harness/strategies.py ``get``): never another strategy's numbers."""
    row = strategies.get(strategy)
    if row.memory is None:
        return None, row.not_planned() or ""
    if row.memory not in FAMILIES:
        return None, (f"not planned: {strategy}'s memory family {row.memory!r} is not registered with the "
                      f"planner (planner/families.py register; known: {', '.join(FAMILIES)})")
    return FAMILIES[row.memory], ""


def why_unplanned(strategy: str) -> str:
    """Why the strategy has no memory plan ("" when it has one): its row (``family_of``), or a name this
    table lacks (a stored plugin strategy)."""
    if strategy not in strategies.names():
        return f"not planned: {strategy} is not in this table"
    return family_of(strategy)[1]


def _moments(family: Family, r: Request) -> tuple[Estimate, Estimate]:
    fp32 = r.precision == "fp32" or "autocast" in r.parts  # the variant autocast: fp32 parameters, as DDP
    step = Step(r.shape, r.n, r.m, 4 if fp32 else 2, r.parts, r.bucket_mb, r.resident, r.foreach)
    backward, optimizer = family.moments(step)
    act = Term("activations", r.activations, r.activation_source, state=False)
    start = Estimate(r.strategy, r.n, r.m, r.precision, "backward", [*backward, act, *r.extra])
    if r.end_activations is not None and r.n > 1 and family.end_of_backward is not None:
        late = family.end_of_backward(step, backward, Term(
            "activations", r.end_activations, "at the end of backward: the root and the first block "
            "(measured at depth 1)", state=False))
        end = Estimate(r.strategy, r.n, r.m, r.precision, "end of backward", [*late, *r.extra])
        start = end if end.total > start.total else start
    return start, Estimate(r.strategy, r.n, r.m, r.precision, "optimizer", [*optimizer, *r.extra])


def of_run(spec: RunSpec, *, resident: bool = False) -> tuple[Estimate, Estimate] | None:
    """``moments`` of a run's own spec: its strategy, shape, N, grad_accum, precision (bf16 for the
    strategies' native mixed precision), variant and bucket size, AdamW as torch defaults on its device
    (foreach on CUDA, the for-loop on CPU); None where state leaves the device (offload)."""
    parts = spec.variant_parts()
    if spec.strategy not in strategies.names():  # a stored plugin strategy absent here: not in this table
        return None
    family, _ = family_of(spec.strategy)
    if family is None or unplanned(parts):
        return None
    return _moments(family, Request(spec.strategy, Shape.of(spec), spec.world_size, spec.grad_accum,
                                    precision="bf16" if spec.precision == "native" else "fp32",
                                    parts=frozenset(parts), bucket_mb=parts.get("bucket"), resident=resident,
                                    foreach=spec.device != "cpu"))


def deepspeed_counted(strategy: str, shape: Shape, world_size: int) -> tuple[float, float]:
    """The planner's zero2/zero3 model states at the 16-bit widths DeepSpeed's
    ``estimate_zero{2,3}_model_states_mem_needs`` assume, without the reduce buckets, gathered
    parameters and transients those leave out (zero3: plus the estimator's 4 B x largest layer):
    (outside the optimizer step, inside it, with the step's flat fp32 gradient copy). ZeRO-2's
    estimate, 2P + 18P/N, is the step's; ZeRO-3's 18P/N lies between 16P/N (shard, master,
    moments, gradient partition) and the step's 20P/N."""
    left_out = ("grad buckets", "gathered")  # the backward moment has no flat copy; the step has it
    family, why = family_of(strategy)
    if family is None:
        raise ValueError(why)
    outside, inside = (sum(t.bytes for t in moment.terms if t.state and t.name not in left_out)
                       for moment in _moments(family, Request(strategy, shape, world_size, precision="bf16")))
    largest = family.estimator_extra(shape)  # zero3: the estimator's 4 B x largest layer
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
