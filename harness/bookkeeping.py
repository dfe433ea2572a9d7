"""Each strategy's bookkeeping, stated: the bytes its own code moves through memory in one optimizer
step beside the model's operators, read in its code at the pinned versions (torch 2.13.0, DeepSpeed
0.19.8). harness/instruments/bookkeeping.py measures the same in a run, and
tests/harness/test_bookkeeping.py holds every term to it at ws2, fp32 and bf16.

A strategy row names its rule (harness/strategies.py ``bookkeeping``: ddp_reducer, fully_shard,
flat_param, deepspeed_stage2, deepspeed_stage3 below). Per step, with N ranks, m micro-batches, P the
parameters (elements; every one trains in pretrain), E_ag and E_rs the elements the step gathers and
reduce-scatters (the strategy table's sends), p the bytes of an element as the strategy computes (2
with dtype bf16 run natively, else 4), r as it reduces (2 with variant bf16-reduce; FSDP's fp32
otherwise, DeepSpeed's p):

DDP (torch/csrc/distributed/c10d/reducer.cpp; gradient_as_bucket_view and batched_grad_copy off, torch's
defaults and the harness's), the gradients in the parameters' width g (4: DDP's bf16 is autocast over
fp32 weights), reduced once a step (no_sync before the last micro-batch)
    copy-in       Reducer::mark_variable_ready_dense: each gradient into its bucket, divided by N on the
                  way (at::mul_out), 2g P; with a comm hook a plain copy_ instead, 2g P
    copy-out      Reducer::finalize_bucket_dense -> copy_bucket_to_grad: the reduced bucket back into
                  each .grad (grad.copy_), 2g P
    accumulate    autograd's AccumulateGrad: under no_sync every rank keeps the full gradients, and from
                  the second micro-batch adds into them, 3g P each (the sharded strategies' own rules
                  state their accumulation)
    bf16 hook     variant bf16-reduce (default_hooks.bf16_compress_hook, torch/distributed/algorithms/
                  ddp_comm_hooks/default_hooks.py _compress_hook): the bucket cast to bf16, (g + 2) P,
                  divided there, 4P, and decompressed back into the bucket, (2 + g) P. The harness
                  runs the variant only on CUDA (strategies.py's rule), so no CPU run measures these
                  three; tests/unit/test_bookkeeping_rules.py runs the hook itself on a bucket.
    PowerSGD      not stated: its low-rank factors' sizes depend on each matrix's shape and rank
FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _fsdp_param.py)
    copy-in       fsdp.all_gather_copy_in: each rank's shard into the all-gather buffer, 2p E_ag / N
    cast          _get_param_all_gather_inputs: the fp32 shard to the param dtype first, (4 + p) E_ag / N
    copy-out      fsdp.split_with_sizes_copy: the gathered parameters out of the buffer, 2p E_ag
    accumulate    under no_sync with p != r the unsharded gradient is kept in r: the first micro-batch's
                  cast (p + r) P, each further one added (p + 2r) P (to_accumulated_grad_if_needed,
                  accumulate_unsharded_grad_if_needed); with p = r it stays the unsharded parameter's
                  .grad, and autograd's AccumulateGrad adds each further one, 3p P
    copy-in       fsdp.chunk_cat: the unsharded gradients into the reduce-scatter buffer, (g + r) E_rs, g
                  the gradients' width then (r once accumulated, else p)
    cast back     _to_dtype_if_needed: the reduced shard to fp32 when r is 2, (r + 4) E_rs / N
    (no divide kernel: fp32 and bf16 reduce with ReduceOp.AVG, _get_gradient_divide_factors)
FSDP1 (torch/distributed/fsdp/_flat_param.py, _runtime_utils.py, use_orig_params=True)
    cast          _use_low_precision_shard: the fp32 shard to the param dtype per gather, (4 + p) E_ag / N
    views' grads  autograd: each micro-batch's gradients concatenated into the flat parameter's, 2p P;
                  from the second on, accumulated there, 3p P each
    cast          _post_backward_hook: the gradient to the reduce dtype when p != r, (p + r) E_rs
    divides       _div_if_needed: by the pre-divide factor on the unsharded gradient, 2r E_rs, and by the
                  post-divide factor on the shard, 2r E_rs / N, each where its factor is above 1
                  (powers of 2 up to about sqrt(N): torch/distributed/algorithms/_comm_hooks/
                  default_hooks.py, DefaultState._get_gradient_predivide_factor)
    cast back     _cast_grad_to_param_dtype: the reduced shard to fp32 when r is 2, (r + 4) E_rs / N
    clip          clip_grad_norm_ (the harness clips): the shards' norm 4P / N, their scaling 8P / N
ZeRO-2 (deepspeed/runtime/zero/stage_1_and_2.py), per micro-batch, then per step
    bucket        reduce_independent_p_g_buckets_and_remove_grads: the gradients into the bucket, 2p P
    divide        average_tensor: the bucket before its all-reduce, 2p P
    copy          allreduce_and_copy_with_multiple_ranks: this rank's part out of it, 2p P / N
    partition     copy_grads_in_partition: into the partition buffer, 2p P / N (+)
    accumulate    independent_gradient_partition_epilogue: from the second micro-batch, 3p P / N (+)
    norm          get_grad_norm_direct: the partition to fp64, (p + 8) P / N, its norm 8P / N
    overflow      has_inf_or_nan (bf16): amax and amin of the partition, 2p P / N each
    clip          unscale_and_clip_grads: the fp32 gradient scaled, 8P / N
    step          the bf16 gradient to fp32, 6P / N, and the fp32 master back to the parameters,
                  (4 + p) P / N (one copy_ with fp32 parameters)
    (+) whole tensors: a parameter that straddles two ranks' partitions is copied whole by both, so the
        measured term may exceed the stated one by up to the largest parameter's bytes per rank
ZeRO-3 (deepspeed/runtime/zero/stage3.py, runtime/comm/coalesced_collectives.py)
    bucket        __add_grad_to_ipg_bucket: the gradients into the bucket, 2p P per micro-batch
    divide        reduce_scatter_coalesced: the bucket before its reduce-scatter, 2p P per micro-batch
    partition     partition_grads: the reduced part into the partition's gradient, 2p P / N, then from the
                  second micro-batch accumulated there, 3p P / N each
    norm          get_grad_norm_direct: (p + 8) P / N and 8P / N, as ZeRO-2
    step          _prepare_fp32_grad_for_sub_group: a bf16 gradient to fp32, (p + 4) P / N;
                  unscale_and_clip_grads 8P / N; _reassign_or_swap_out_partitioned_parameters: the
                  master back to the parameters, (4 + p) P / N
    (ZeRO-3 gathers straight into the parameters' storage: no copy of its own)

Reduced every micro-batch (Composer's and torchtitan's FSDP: no no_sync; ``Sizes.per_micro_batch``),
E_rs counts every micro-batch's reduce-scatter and the gradients are accumulated as shards instead:
FSDP1's views' gradients are concatenated afresh each micro-batch (the flat gradient is freed after its
reduce, _reduce_grad) and ``_accumulate_sharded_grad`` adds the fp32 shard from the second on,
12P / N each; FSDP2 never keeps an unsharded gradient and ``foreach_reduce`` adds the fp32 shard the
same way. These two forms are read from the code at the pinned version; the harness always reduces
once a step, so tests/harness/test_bookkeeping.py measures only the once-a-step forms.

The same code runs on a GPU; only the sizes change with the model, N and m. DDP's copies run in its C++
reducer with no frame of Python: the instrument tells them by what they write (its docstring). Standard
library only.
"""

from __future__ import annotations

from dataclasses import dataclass

FSDP2 = "torch.distributed.fsdp._fully_shard."
FSDP1 = "torch.distributed.fsdp."
ZERO2 = "deepspeed.runtime.zero.stage_1_and_2:"
ZERO3 = "deepspeed.runtime.zero.stage3:"
DDP_REDUCER = "autograd:ddp_reducer"  # the instrument's name for the reducer's C++ copies
DDP_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks:"
ACCUMULATE_GRAD = "autograd:accumulate_grad"  # autograd adding a micro-batch's gradient into .grad


@dataclass(frozen=True)
class Term:
    """Bytes one step moves for ``what``: issued at ``where`` (module:function) as ``op``, as the
    instrument keys its rows; ``slack``: bytes the measured term may exceed it by (whole tensors)."""

    what: str
    where: str
    op: str
    bytes: float
    slack: float = 0.0


@dataclass(frozen=True)
class Sizes:
    """What the terms are in: ranks, micro-batches, parameters, elements gathered and reduce-scattered
    per step, the compute and reduce widths, and the largest parameter's elements; ``per_micro_batch``:
    the gradients are reduced every micro-batch, not once a step (module docstring)."""

    n: int
    m: int
    params: float
    gathered: float
    reduced: float
    p: int
    r: int
    largest: float = 0.0
    per_micro_batch: bool = False
    hook: str = ""  # DDP's gradient communication hook: "", "bf16" or "powersgd" (its variant)


def sizes(spec, rule: str, sends: dict[str, float], params: float, largest: float = 0.0, *,
          n: int | None = None, grad_accum: int | None = None, per_micro_batch: bool = False) -> Sizes:
    """``spec``'s sizes under ``rule`` (the strategy row's ``bookkeeping``); ``sends``: the strategy
    table's bytes per collective per step; ``n``, ``grad_accum``: the shard group's ranks and the
    micro-batches where they are not the spec's (HSDP's shard group, a planned case)."""
    parts = spec.variant_parts()
    p = 2 if spec.precision == "native" else 4
    r = 2 if "bf16-reduce" in parts else (p if rule in REDUCES_IN_COMPUTE_DTYPE else 4)
    hook = "powersgd" if "powersgd" in parts else "bf16" if "bf16-reduce" in parts else ""
    return Sizes(n or spec.world_size, grad_accum or spec.grad_accum, params,
                 sends.get("all_gather", 0.0) / p, sends.get("reduce_scatter", 0.0) / r, p, r, largest,
                 per_micro_batch, hook)


def total(rule: str, s: Sizes) -> float:
    """Bytes of every term of a step under ``rule``; 0 where the row names no rule this module has."""
    return sum(t.bytes for t in stated(rule, s) or [])


def predivide(n: int) -> tuple[float, float]:
    """FSDP1's pre- and post-divide factors (torch/distributed/fsdp/_init_utils.py sets them from
    torch/distributed/algorithms/_comm_hooks/default_hooks.py ``_get_gradient_predivide_factor``)."""
    factor = 1
    while n % factor == 0 and n / factor > factor:
        factor *= 2
    return float(factor), n / factor


def stated(rule: str, s: Sizes) -> list[Term] | None:
    """The terms of a step under ``rule`` (a strategy row's ``bookkeeping``: module docstring), or None
    where the row names no rule this module has."""
    terms = RULES.get(rule)
    got = terms(s) if terms else None
    return None if got is None else [t for t in got if t.bytes > 0]


def _ddp(s: Sizes) -> list[Term] | None:
    if s.hook == "powersgd":
        return None
    g = s.p
    hooked = s.hook == "bf16"
    return [
        Term("gradients into the buckets, divided by N", DDP_REDUCER, "aten.mul",
             0.0 if hooked else 2 * g * s.params),
        Term("gradients into the buckets", DDP_REDUCER, "aten.copy_", 2 * g * s.params if hooked else 0.0),
        Term("buckets back into the gradients", DDP_REDUCER, "aten.copy_", 2 * g * s.params),
        Term("gradients accumulated under no_sync", ACCUMULATE_GRAD, "aten.add_",
             3 * g * s.params * (s.m - 1)),
        Term("bf16 hook: the bucket to bf16", DDP_HOOKS + "_compress_hook", "aten._to_copy",
             (g + 2) * s.params if hooked else 0.0),
        Term("bf16 hook: divided by N", DDP_HOOKS + "_compress_hook", "aten.div_",
             4 * s.params if hooked else 0.0),
        Term("bf16 hook: back into the bucket", DDP_HOOKS + "decompress", "aten.copy_",
             (2 + g) * s.params if hooked else 0.0),
    ]


def _fsdp2(s: Sizes) -> list[Term]:
    where = FSDP2 + "_fsdp_collectives:"
    accumulated = s.m > 1 and s.p != s.r and not s.per_micro_batch
    return [
        Term("all-gather copy-in", where + "foreach_all_gather", "fsdp.all_gather_copy_in",
             2 * s.p * s.gathered / s.n),
        Term("cast to the param dtype", where + "_get_param_all_gather_inputs", "aten._foreach_copy_",
             (4 + s.p) * s.gathered / s.n if s.p != 4 else 0.0),
        Term("all-gather copy-out", where + "foreach_all_gather_copy_out", "fsdp.split_with_sizes_copy",
             2 * s.p * s.gathered),
        Term("gradient kept in the reduce dtype", FSDP2 + "_fsdp_param:to_accumulated_grad_if_needed",
             "aten._to_copy", (s.p + s.r) * s.params if accumulated else 0.0),
        Term("gradient accumulated", FSDP2 + "_fsdp_param:accumulate_unsharded_grad_if_needed", "aten.add_",
             (s.m - 1) * (s.p + 2 * s.r) * s.params if accumulated else 0.0),
        Term("unsharded gradient accumulated by autograd", ACCUMULATE_GRAD, "aten.add_",
             (s.m - 1) * 3 * s.p * s.params if s.p == s.r and not s.per_micro_batch else 0.0),
        Term("reduce-scatter copy-in", where + "foreach_reduce_scatter_copy_in", "fsdp.chunk_cat",
             ((s.r if accumulated else s.p) + s.r) * s.reduced),
        Term("reduced shard to fp32", where + "_to_dtype_if_needed", "aten._to_copy",
             (s.r + 4) * s.reduced / s.n if s.r != 4 else 0.0),
        Term("sharded gradient accumulated", where + "foreach_reduce", "aten.add_",
             12 * s.params / s.n * (s.m - 1) if s.per_micro_batch else 0.0),
    ]


def _fsdp1(s: Sizes) -> list[Term]:
    pre, post = predivide(s.n)
    divides = (2 * s.r * s.reduced if pre > 1 else 0.0) + (2 * s.r * s.reduced / s.n if post > 1 else 0.0)
    return [
        Term("cast to the param dtype", FSDP1 + "_flat_param:_use_low_precision_shard", "aten.copy_",
             (4 + s.p) * s.gathered / s.n if s.p != 4 else 0.0),
        Term("views' gradients concatenated", "autograd:flat_param", "aten.cat", 2 * s.p * s.params * s.m),
        Term("flat gradient accumulated", "autograd:flat_param", "aten.add_",
             0.0 if s.per_micro_batch else 3 * s.p * s.params * (s.m - 1)),
        Term("gradient to the reduce dtype", FSDP1 + "_runtime_utils:_post_backward_hook", "aten._to_copy",
             (s.p + s.r) * s.reduced if s.p != s.r else 0.0),
        Term("pre- and post-divide", FSDP1 + "_runtime_utils:_div_if_needed", "aten.div_", divides),
        Term("reduced shard to fp32", FSDP1 + "_runtime_utils:_cast_grad_to_param_dtype", "aten._to_copy",
             (s.r + 4) * s.reduced / s.n if s.r != 4 else 0.0),
        Term("sharded gradient accumulated", FSDP1 + "_runtime_utils:_accumulate_sharded_grad", "aten.add_",
             12 * s.params / s.n * (s.m - 1) if s.per_micro_batch else 0.0),
        Term("clip: the shards' norm", FSDP1 + "fully_sharded_data_parallel:<listcomp>",
             "aten.linalg_vector_norm",
             4 * s.params / s.n),
        Term("clip: the shards scaled", FSDP1 + "fully_sharded_data_parallel:clip_grad_norm_", "aten.mul_",
             8 * s.params / s.n),
    ]


def _deepspeed_step(s: Sizes, where: str) -> list[Term]:
    share = s.params / s.n
    return [
        Term("norm: the partition to fp64", where + "get_grad_norm_direct", "aten._to_copy",
             (s.p + 8) * share),
        Term("norm", where + "get_grad_norm_direct", "aten.linalg_vector_norm", 8 * share),
        Term("clip", where + "unscale_and_clip_grads", "aten.mul_", 8 * share),
    ]


def _zero2(s: Sizes) -> list[Term]:
    share, slack = s.params / s.n, 2 * s.p * s.largest * s.m
    return [
        Term("gradients into the bucket", ZERO2 + "reduce_independent_p_g_buckets_and_remove_grads",
             "aten.copy_",
             2 * s.p * s.params * s.m),
        Term("bucket divided", ZERO2 + "average_tensor", "aten.div_", 2 * s.p * s.params * s.m),
        Term("this rank's part out", ZERO2 + "allreduce_and_copy_with_multiple_ranks", "aten.copy_",
             2 * s.p * share * s.m),
        Term("into the partition", ZERO2 + "copy_grads_in_partition", "aten.copy_",
             2 * s.p * share * s.m, slack),
        Term("partition accumulated", ZERO2 + "independent_gradient_partition_epilogue", "aten.add_",
             3 * s.p * share * (s.m - 1), 1.5 * slack),
        *_deepspeed_step(s, ZERO2),
        Term("overflow check: amax", "deepspeed.runtime.utils:has_inf_or_nan", "aten.amax",
             s.p * share if s.p == 2 else 0.0),
        Term("overflow check: amin", "deepspeed.runtime.utils:has_inf_or_nan", "aten.amin",
             s.p * share if s.p == 2 else 0.0),
        Term("bf16 gradient to fp32", ZERO2 + "step", "aten._to_copy", 6 * share if s.p == 2 else 0.0),
        Term("master to the parameters", ZERO2 + "step", "aten.copy_", (4 + s.p) * share),
    ]


def _zero3(s: Sizes) -> list[Term]:
    share = s.params / s.n
    return [
        Term("gradients into the bucket", ZERO3 + "__add_grad_to_ipg_bucket", "aten.copy_",
             2 * s.p * s.params * s.m),
        Term("bucket divided", "deepspeed.runtime.comm.coalesced_collectives:reduce_scatter_coalesced",
             "aten.div_", 2 * s.p * s.params * s.m),
        Term("into the partition", ZERO3 + "partition_grads", "aten.copy_", 2 * s.p * share),
        Term("partition accumulated", ZERO3 + "partition_grads", "aten.add_", 3 * s.p * share * (s.m - 1)),
        *_deepspeed_step(s, ZERO3),
        Term("bf16 gradient to fp32", ZERO3 + "_prepare_fp32_grad_for_sub_group", "aten._to_copy",
             (s.p + 4) * share if s.p == 2 else 0.0),
        Term("master to the parameters", ZERO3 + "_reassign_or_swap_out_partitioned_parameters", "aten.copy_",
             (4 + s.p) * share),
    ]


# a strategy row's ``bookkeeping`` -> its terms; DeepSpeed reduces in the gradients' own dtype
RULES = {"ddp_reducer": _ddp, "fully_shard": _fsdp2, "flat_param": _fsdp1, "deepspeed_stage2": _zero2,
         "deepspeed_stage3": _zero3}
REDUCES_IN_COMPUTE_DTYPE = frozenset({"deepspeed_stage2", "deepspeed_stage3"})
# the rules with a form for gradients reduced every micro-batch (Sizes.per_micro_batch): FSDP's
PER_MICRO_BATCH = frozenset({"fully_shard", "flat_param"})
