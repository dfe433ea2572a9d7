"""The memory plan of a model at a shape, as ``llmbench-plan`` prints it and as the report's "Does it fit?"
shows it for a GPU profile: one function for both, so the two cannot disagree (issue 43). Activations
are measured on the model's own architecture under FakeTensorMode at the precision each strategy
computes in (pytest_llmbench/planner/memref.py), once per model, shape and precision in a process.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import strategies
from harness.shapes import block_tensors
from harness.spec import RunSpec
from pytest_llmbench.planner import memory as plan

GIB = plan.GIB
# What "fits" leaves out, said wherever a plan meets a device's memory (issue 43's CUDA reserve).
RESERVE_NOTE = ("allocated bytes against the device's memory: the CUDA reserve (the CUDA context, NCCL's "
                "buffers, the allocator's slack) is not subtracted; a GPU run records it per rank "
                "(memory_per_rank: outside_allocator_gib, allocator_slack_gib)")
_MEASURED: dict[tuple[str, str, str], float] = {}  # (the spec's identity, precision, measure) -> bytes


@dataclass(frozen=True)
class Row:
    strategy: str
    grad_accum: int
    by_n: dict[int, plan.Estimate]


def world_sizes(profile) -> list[int]:
    """The sizes a profile is planned at: the ones it runs and the ones its report projects to."""
    return sorted({*profile.world_sizes, *profile.project_world_sizes})


def profile_spec(profile, model: str, workload: str) -> RunSpec:
    """A plan model at the profile's micro-batch, longest sequence (within the model's positions),
    LoRA settings, first variant, workload and precision: what ``llmbench-plan --profile`` takes."""
    lora = {f"lora_{key}": value for key, value in profile.lora.items()}
    seq = min(max(profile.seq_lens), RunSpec.from_preset(model).block_size)
    spec = RunSpec.from_preset(model, seq_len=seq, micro_batch=profile.micro_batch, **lora)
    return spec.replace(workload=workload, dtype=profile.dtype, variant=profile.variants[0])


def activations(spec: RunSpec, names: list[str]) -> tuple[dict[str, float], str]:
    """({strategy: bytes of one micro-batch's activations}, where they came from), measured at the
    precision each strategy computes in at the spec's dtype (RunSpec.precision: bf16 is DDP's autocast
    over fp32 weights, the others' bf16 weights), once per precision."""
    from pytest_llmbench.planner import memref

    source = "measured under FakeTensorMode (MemTracker, CPU kernels)"
    plain = spec.replace(workload="pretrain")
    if spec.workload != "pretrain":  # peft's adapters and bitsandbytes' Params4bit refuse fake tensors
        source += (" on the same architecture without adapters (peft and bitsandbytes cannot build "
                   "under fake tensors; the adapters' rank-r intermediates are not counted)")
    extra = 0.0
    if spec.workload == "qlora":
        extra = 4.0 * max(n for n, linear in block_tensors(spec) if linear)
        source += ", plus one dequantised linear weight in fp32 (4 B x the largest)"
    out = {}
    for name in names:
        # the precision the case computes in (qlora: autocast whatever the strategy)
        one = plain.replace(strategy=name)
        precision = spec.replace(strategy=name).precision
        out[name] = _measured(one, precision, memref.activation_peak_by_depth) + extra
    return out, source


def end_activations(spec: RunSpec, names: list[str]) -> dict[str, float]:
    """{strategy: bytes alive at the end of backward}: the root and the first block, measured on the
    model at depth 1 as ``activations`` measures the whole (plan.py's end-of-backward moment)."""
    from pytest_llmbench.planner import memref

    extra = 4.0 * max(n for n, linear in block_tensors(spec) if linear) if spec.workload == "qlora" else 0.0
    plain = spec.replace(workload="pretrain", n_layer=1)
    return {name: _measured(plain.replace(strategy=name), spec.replace(strategy=name).precision,
                            memref.activation_peak) + extra for name in names}


def _measured(spec: RunSpec, precision: str, measure) -> float:
    key = (spec.replace(strategy=strategies.REPLICA, dtype="fp32").dumps(), precision, measure.__name__)
    if key not in _MEASURED:
        _MEASURED[key] = float(measure(spec))
    return _MEASURED[key]


def estimates(spec: RunSpec, names: list[str], sizes: list[int], accums: list[int], activations: dict,
              *, foreach: bool = True, activation_source: str = plan.MEASURED_ACTIVATIONS,
              end: dict[str, float] | None = None) -> list[Row]:
    """Every planned strategy and grad_accum at every N (a strategy whose row declares no memory terms
    is left out: ``not_planned``)."""
    precision = "bf16" if spec.dtype == "bf16" else "fp32"
    parts = frozenset(spec.variant_parts())
    rows = []
    for name in names:
        if plan.why_unplanned(name):
            continue
        for accum in accums:
            by_n = {n: plan.estimate(name, plan.Shape.of(spec), n, grad_accum=accum,
                                     activations=activations[name], precision=precision, variant_parts=parts,
                                     foreach=foreach, activation_source=activation_source,
                                     end_activations=(end or {}).get(name))
                    for n in sizes}
            if all(e is not None for e in by_n.values()):
                rows.append(Row(name, accum, by_n))
    return rows


def for_profile(profile, model: str, workload: str) -> tuple[RunSpec, list[Row], str]:
    """(spec, rows, activation source) of one plan model of a profile, as
    ``llmbench-plan --profile NAME --model MODEL --workload WORKLOAD`` plans it."""
    spec = profile_spec(profile, model, workload)
    acts, source = activations(spec, list(profile.strategies))
    rows = estimates(spec, list(profile.strategies), world_sizes(profile), [profile.grad_accum], acts,
                     end=end_activations(spec, list(profile.strategies)))
    return spec, rows, source
