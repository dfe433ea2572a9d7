"""The step-time predictor asked about one case: a spec (model, strategy, variant, micro-batch, sequence)
on a part and a network at N ranks. The one place that turns a case into the predictor's inputs, for
``llmbench-plan --time``, the report's predicted rows and the validation against published runs.

What a variant changes in the prediction:
    ac, ac-every<K>, ac-op  the recompute (harness/recompute.py): whole blocks, every K-th block, or
                            torchtitan's op-level policy (the block's matmul FLOPs it recomputes, counted
                            by harness/derive.py ``op_recomputed_weights``, and its memory-bound ops)
    bf16-reduce, noreshard  the strategy table's sends (harness/strategies.py) and payloads
    hsdp                    gathers and reduce-scatters within a node (the shard group), and an
                            all-reduce of each rank's gradient shard across nodes, the node's NICs shared
                            by the node's ranks (FSDP1's HYBRID_SHARD the same: timed, not run)
    compile                 the memory-bound operators of what the strategy row compiles (``compiles``: the
                            model, or FSDP2's blocks) as torch.compile's fused kernels (planner/fusion.py)
    bucket, autocast        nothing the predictor models (bucket sizes, fp32 master weights)
Refused, by name: offload and powersgd (no PCIe-offload or compression model), and what the harness
itself refuses for the strategy (RunSpec.variant_problem).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness import bookkeeping, strategies
from harness.derive import op_recomputed_weights
from harness.devices import Device
from harness.recompute import Recompute
from harness.shapes import block_matmuls, payloads, spec_flops_per_token
from harness.variants import VARIANTS
from pytest_llmbench.planner import configs, steptime
from pytest_llmbench.planner.step import Network


@dataclass(frozen=True)
class Sync:
    """How often the gradients are reduced: "step" (the harness: no sync until the last micro-batch,
    or the strategy table's own count) or "micro_batch" (Composer's and torchtitan's FSDP, which
    reduce-scatter after every micro-batch under full sharding); and whether the collectives run beside
    compute (``overlap_comm``: DeepSpeed's setting of that name). DeepSpeed 0.19.8 with it false puts
    them on the compute stream: ZeRO-3's parameter gathers (runtime/zero/parameter_offload.py, the
    ``__allgather_stream``) and its gradient reduction (runtime/zero/stage3.py,
    ``reduce_and_partition_stream``) are then the default stream, and ZeRO-2 reduces as each bucket
    fills; compute hides none of it. FSDP and DDP always overlap."""

    grads: str = "step"
    overlap_comm: bool = True


def problem(spec, world_size: int, devices_per_node: int) -> str | None:
    """Why the predictor cannot time this strategy and variant at N, or None. A variant the strategy's row
    times but does not run (``timed_only``: FSDP1's HYBRID_SHARD) is checked by the variant's own rule
    (one node is refused) and left out of what the harness would refuse."""
    row = strategies.find(spec.strategy)
    if row is None:
        return f"--strategy {spec.strategy}: not in the strategy table"
    return _problem(spec, row, world_size, devices_per_node)


def _problem(spec, row: strategies.Strategy, world_size: int, devices_per_node: int) -> str | None:
    for part in spec.variant_parts():
        if part in VARIANTS and VARIANTS[part].untimed:  # the variant's row says why
            return f"variant {part}: {VARIANTS[part].untimed}"
    nnodes = max(1, math.ceil(world_size / devices_per_node))
    timed = [p for p in spec.variant_parts() if p in row.timed_only]
    for part in timed:
        why = VARIANTS[part].problem("cuda", nnodes)
        if why:
            return why
    kept = "+".join(t for t in spec.variant.split("+") if not any(t.startswith(p) for p in timed)) or "base"
    return spec.replace(device="cuda", world_size=world_size, nnodes=nnodes, variant=kept).variant_problem()


def predict(spec, device: Device, network: Network, *, world_size: int, grad_accum: int,
            config: dict | None = None, sync: Sync = Sync(), fit: steptime.Fit = steptime.FIT,
            ) -> steptime.Prediction:
    """The estimated step of one rank of ``spec`` at ``world_size`` (``config``: the Hugging Face
    config.json the operators are counted on; None: the spec's own model). Raises ValueError with
    ``problem``'s sentence for what cannot be timed."""
    row = strategies.find(spec.strategy)  # resolved once here: what follows takes the row
    why = (_problem(spec, row, world_size, network.devices_per_node) if row is not None
           else f"--strategy {spec.strategy}: not in the strategy table")
    if why:
        raise ValueError(why)
    run = spec.replace(dtype="bf16", world_size=world_size)
    parts = run.variant_parts()
    profile = configs.operator_profile(config, run, micro_batch=run.micro_batch, seq_len=run.seq_len)
    recompute = Recompute.of(parts)
    layers = block_matmuls(run)
    op_share = op_recomputed_weights(run) / sum(w for w, _ in layers)
    shard_n = min(world_size, network.devices_per_node) if "hsdp" in parts else world_size
    sends, calls = row.stated_bytes(parts, payloads(run), grad_accum), row.stated_calls(parts, grad_accum)
    once = calls.get("reduce_scatter", grad_accum)
    if sync.grads == "micro_batch" and once < grad_accum:  # the table's once a step, every micro-batch
        sends["reduce_scatter"] *= grad_accum / once
        calls["reduce_scatter"] = grad_accum
    across = []
    if shard_n < world_size:  # hsdp: the shard's gradient all-reduced across the replicas
        shared = Network(1, network.inter_node_gbps and network.inter_node_gbps / shard_n,
                                  network.inter_node_busbw_gbps and network.inter_node_busbw_gbps / shard_n)
        across.append(("all_reduce", payloads(run)["grads"] / shard_n, world_size // shard_n, shared))
    work = steptime.Work(run.micro_batch, run.seq_len, grad_accum, recompute,
                         model_flops_per_token=spec_flops_per_token(run), op_share=op_share,
                         compiled=row.compiles if "compile" in parts else "")
    unhidden = tuple(sends) if not sync.overlap_comm else ()  # every collective on the compute stream
    own = bookkeeping.sizes(run, row.bookkeeping, sends, profile.params, n=shard_n, grad_accum=grad_accum,
                            per_micro_batch=sync.grads == "micro_batch")
    terms = bookkeeping.stated(row.bookkeeping, own)
    traffic = steptime.Traffic(sends, calls, shard_n, network, tuple(across), unhidden,
                               bookkeeping=sum(t.bytes for t in terms or []))
    prediction = steptime.predict(profile, device, work, traffic, strategy=run.strategy, fit=fit,
                                  shards_optimizer=row.sharded("optimizer", parts))
    if terms is None:
        prediction.not_stated.append(f"{run.strategy} --variant {run.variant}: the bytes its own code moves "
                                     "(harness/bookkeeping.py) are not stated, and none are timed")
    return prediction
