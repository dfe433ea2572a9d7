"""Projection to world sizes that were not measured, and the activation fit of the memory planner
(whose state terms are pytest_llmbench/planner/memory.py). Pure: no torch, no pandas; every input is a number
that was measured, or a figure labelled as declared.

Step time at N ranks, per strategy: planner/step.py's model (the one llmbench-plan estimates with),
calibrated by measured points: every term below is measured, or fitted on measured world sizes
(all times per optimizer step, medians):

    step(N)     = compute(N) + wrapper + exposed(N)
    compute(N)  = compute-only step at N per token x tokens per rank: measured by N's own probe where
                  N was run (ranks that share cores are slower: a measured input), else N0's
    wrapper     = step(N0) - compute-only(N0), or 0 if that is negative (noise)   (harness/derive.py)
    comm(N)     = sum over the step's measured messages of  count x t(op, S, N)
    exposed(N)  = max(0, comm(N) - overlap x compute(N))   (step.Overlap with hides = overlap)

The messages are the case's own: every collective of one steady step as harness/traffic.py records
it (op, S = the whole array, count), from the group's smallest measured world size above 1. Their
sizes and counts do not change with N (measured equal at ws2 and ws4, tests/harness/test_traffic.py);
with another number of micro-batches per step (strong scaling) each op's count follows the strategy
table's formula (harness/strategies.py). A message's time is the collectives probe's, carried to N
by the ring model's latency and bandwidth laws (step.Bandwidth). Across nodes: the probe of a
multi-node world size, else the profile's declared link figure (bandwidth only: no latency term,
which makes latency-bound steps optimistic; the table names the link). ``exposed`` is Calculon's
rule (Isaacs et al., SC'23): communication overlapped with compute costs only what the compute
cannot hide.
``overlap`` is fitted on the measured world sizes above N0 so that the model reproduces each of them
(0 when there is none: nothing hidden); a measured exposed time below 0 is noise and counts as 0.
The leave-one-out validation predicts each measured N from the others with N's own compute-only
step: what it checks is the communication model, not a compute that changed for other reasons.

A strategy not in the table is an error, never projected with another's numbers; a group with no
measured traffic (results recorded before schema 5) is not projected, nor variants whose traffic
the table does not describe (offload, powersgd, hsdp: ``Variant.projected``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import strategies
from harness.bandwidth import OPS
from harness.variants import VARIANTS
from pytest_llmbench.planner.step import Bandwidth, Overlap, comm_s

DEFAULT_WORLD_SIZES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Point:
    """One measured world size of a strategy (the medians of its run, or the mean over trials)."""

    world_size: int
    step_s: float
    compute_s: float | None
    tokens_per_step: int
    grad_accum: int


@dataclass(frozen=True)
class Group:
    """One strategy as run (profile, workload, variant, seq len) and its measured world sizes."""

    label: str
    strategy: str  # the strategy table's name
    variant_parts: frozenset[str]
    points: list[Point]
    traffic: list[dict] = field(default_factory=list)  # measured messages of one step (harness/traffic.py)
    traffic_micro_batches: int = 1  # the grad_accum they were recorded at
    payloads: dict[str, float] | None = None  # harness/shapes.py payloads: each op's count by formula
    baseline_world_size: int = 1
    usd_per_device_hour: float | None = None
    global_batch_tokens: int | None = None  # strong scaling; None: the largest measured step's tokens
    seq_len: int = 1
    run_as: str = ""  # RunSpec.run_as: the strategy as run, as the report's rows name it
    row: strategies.Strategy | None = None  # the strategy's row, resolved where the group is made


def op_scale(group: Group, micro_batches: int) -> dict[str, float]:
    """Per op, its count at ``micro_batches`` per step over its count as measured: the strategy
    table's formula (with the model's payloads); without payloads, per micro-batch for an op the
    formula sends every micro-batch (an upper bound where it also sends it once per step)."""
    m0 = group.traffic_micro_batches
    if micro_batches == m0:
        return {}
    row = group.row
    if row is None:
        raise ValueError(f"group {group.label}: no strategy row (report/scale.py resolves it as it makes "
                         f"the group)")
    if group.payloads is not None:
        at, at0 = (row.stated_bytes(group.variant_parts, group.payloads, m) for m in (micro_batches, m0))
        return {op: at[op] / at0[op] for op in at if at0[op] > 0}
    per_micro = {s.op for s in row.layout(group.variant_parts)[1] if s.per == "micro_batch"}
    return {op: micro_batches / m0 for op in per_micro}


def group_comm_s(group: Group, world_size: int, micro_batches: int, link: Bandwidth) -> float:
    """Seconds of one step's messages on ``world_size`` ranks (control scalars included)."""
    if world_size == 1:
        return 0.0
    scale = op_scale(group, micro_batches)
    messages = [(row["op"], row["bytes"], row["count"] * scale.get(row["op"], 1.0))
                for row in group.traffic if row["op"] in OPS]
    return sum(comm_s(messages, link, world_size).values())


@dataclass(frozen=True)
class Row:
    label: str
    world_size: int
    link: str
    step_s: float
    tokens_per_s: float
    weak_efficiency: float
    exposed_comm_share: float
    strong_step_s: float | None
    strong_efficiency: float | None
    usd_per_million_tokens: float | None
    measured_step_s: float | None  # beside it, never mixed: the measured median at this N


@dataclass(frozen=True)
class Validation:
    label: str
    world_size: int
    predicted_s: float
    measured_s: float
    error: float  # predicted / measured - 1
    fitted_on: str


@dataclass
class Projection:
    rows: list[Row] = field(default_factory=list)
    validation: list[Validation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Model:
    """One group's calibrated model (from its baseline) with a link per world size."""

    def __init__(self, group: Group, link_for: Callable[[int], Bandwidth | None]) -> None:
        self.group, self.link_for = group, link_for
        base = next(p for p in group.points if p.world_size == group.baseline_world_size)
        self.base = base
        self.tokens0 = base.tokens_per_step / base.world_size  # per rank
        self.micro_tokens = self.tokens0 / base.grad_accum
        self.wrapper = max(0.0, base.step_s - base.compute_s)  # below 0 is timing noise: counted as 0

    def compute(self, world_size: int, tokens_per_rank: float) -> float:
        """The compute-only step at N: measured by that world size's own probe where there is one (a
        measured input, e.g. ranks sharing cores run slower), else the baseline's; per token."""
        point = next((p for p in self.group.points if p.world_size == world_size and p.compute_s), self.base)
        return point.compute_s * tokens_per_rank / (point.tokens_per_step / point.world_size)

    def step(self, world_size: int, tokens_per_rank: float, overlap: float) -> tuple[float, float]:
        """(step seconds, exposed communication seconds)."""
        compute = self.compute(world_size, tokens_per_rank)
        link = self.link_for(world_size)
        micro_batches = self.micro_batches(tokens_per_rank)
        comm = group_comm_s(self.group, world_size, micro_batches, link) if link else 0.0
        exposed = Overlap(hides=overlap).exposed_s(comm, compute)
        return compute + self.wrapper + exposed, exposed

    def overlap_from(self, points: list[Point]) -> float | None:
        """Mean over ``points`` of the share of compute that hid communication, each the value that
        makes ``step`` reproduce that point (with the same compute, the point's own measured one),
        clamped to [0, 1]; an exposed time below 0 (the step measured faster than compute + wrapper:
        noise) counts as 0, not as more hiding."""
        shares = []
        for p in points:
            link = self.link_for(p.world_size)
            if link is None:
                continue
            tokens = p.tokens_per_step / p.world_size
            compute = self.compute(p.world_size, tokens)
            comm = group_comm_s(self.group, p.world_size, self.micro_batches(tokens), link)
            exposed = max(0.0, p.step_s - compute - self.wrapper)
            if comm > 0:
                shares.append(min(1.0, max(0.0, (comm - exposed) / compute)))
        return sum(shares) / len(shares) if shares else None

    def micro_batches(self, tokens_per_rank: float) -> int:
        return max(1, math.ceil(tokens_per_rank / self.micro_tokens - 1e-9))


def project(group: Group, world_sizes: list[int], link_for: Callable[[int], Bandwidth | None]) -> Projection:
    out = Projection()
    bases = [p for p in group.points if p.world_size == group.baseline_world_size and p.compute_s]
    if not bases:
        out.notes.append(f"{group.label}: no measured ws{group.baseline_world_size} baseline with a "
                         f"compute-only step; not projected")
        return out
    if not group.traffic:
        out.notes.append(f"{group.label}: no measured traffic (results recorded before pytest-llmbench "
                         f"measured each step's collectives, or no run above one rank); not projected: "
                         f"re-run")
        return out
    if any(not VARIANTS[part].projected for part in group.variant_parts):
        out.notes.append(f"{group.label}: variant {'+'.join(sorted(group.variant_parts))} changes what is "
                         f"communicated in ways this model does not describe; not projected")
        return out
    model = Model(group, link_for)
    above = [p for p in group.points if p.world_size > group.baseline_world_size]
    overlap = model.overlap_from(above)
    out.validation = _leave_one_out(model, above)
    if overlap is None:
        overlap = 0.0
        out.notes.append(f"{group.label}: no measured world size above the baseline to fit the overlap "
                         f"on; assumed 0 (no communication hidden)")
    measured = {p.world_size: p.step_s for p in group.points}
    global_tokens = group.global_batch_tokens or max(p.tokens_per_step for p in group.points)
    n0 = group.baseline_world_size
    strong0 = model.step(n0, global_tokens / n0, overlap)[0]
    weak0 = model.step(n0, model.tokens0, overlap)[0]  # = the measured step unless its wrapper was noise < 0
    for n in sorted({*measured, *world_sizes}):
        link = link_for(n)
        if n > 1 and link is None:
            out.notes.append(f"{group.label}: no bandwidth for ws{n} (no probe measured across nodes and "
                             f"no declared inter_node_busbw_gbps in the profile's [network]); stopped there")
            break
        step, exposed = model.step(n, model.tokens0, overlap)
        tps = n * model.tokens0 / step
        strong = model.step(n, global_tokens / n, overlap)[0] if global_tokens / n >= group.seq_len else None
        out.rows.append(Row(
            label=group.label, world_size=n, link=link.source if link and n > 1 else "-", step_s=step,
            tokens_per_s=tps, weak_efficiency=weak0 / step, exposed_comm_share=exposed / step,
            strong_step_s=strong, strong_efficiency=n0 * strong0 / (n * strong) if strong else None,
            usd_per_million_tokens=(group.usd_per_device_hour * n / 3600 / tps * 1e6
                                    if group.usd_per_device_hour else None),
            measured_step_s=measured.get(n)))
    return out


def _leave_one_out(model: Model, above: list[Point]) -> list[Validation]:
    """Each measured world size above N0 predicted from the baseline and the others alone."""
    out = []
    for point in above:
        others = [p for p in above if p is not point]
        overlap = model.overlap_from(others)
        fitted = (f"ws{model.base.world_size}" + "".join(f", ws{p.world_size}" for p in others)
                  + ("" if overlap is not None else " (no point to fit the overlap on: 0 assumed)"))
        predicted = model.step(point.world_size, point.tokens_per_step / point.world_size, overlap or 0.0)[0]
        out.append(Validation(model.group.label, point.world_size, predicted, point.step_s,
                              predicted / point.step_s - 1, fitted))
    return out


# ---- activations of the memory planner (its state terms: pytest_llmbench/planner/memory.py) ----------

@dataclass(frozen=True)
class MemoryCase:
    """A measured case: its predicted state bytes, its activation units and its measured peak."""

    label: str
    world_size: int
    state: float
    units: float  # micro_batch x seq_len x n_layer x n_embd
    peak: float


@dataclass(frozen=True)
class ActivationFit:
    intercept: float  # bytes every rank holds beside state and activations (CPU: the runtime's)
    per_unit: float  # bytes per (token x layer x hidden unit) of one micro-batch
    errors: list[tuple[str, int, float]]  # (label, ws, predicted / measured - 1) of every case

    def predict(self, state: float, units: float) -> float:
        return self.intercept + state + self.per_unit * units


def fit_activations(cases: list[MemoryCase], *, runtime_counted: bool) -> ActivationFit | None:
    """peak - state = intercept + per_unit x units, least squares. With a single activation size the
    two cannot be told apart: ``runtime_counted`` (CPU peak RSS, which holds the runtime's own
    memory) takes it all as the intercept, else (CUDA allocated bytes) all as activations."""
    if not cases:
        return None
    xs, ys = [c.units for c in cases], [c.peak - c.state for c in cases]
    if len(set(xs)) == 1 and runtime_counted:
        intercept, slope = sum(ys) / len(ys), 0.0
    elif len(set(xs)) > 1:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        slope = max(slope, 0.0)
        intercept = my - slope * mx
    else:
        intercept, slope = 0.0, max(0.0, sum(ys) / sum(xs))
    fit = ActivationFit(intercept, slope, [])
    errors = [(c.label, c.world_size, fit.predict(c.state, c.units) / c.peak - 1) for c in cases]
    return ActivationFit(intercept, slope, errors)


__all__ = ["OPS", "Bandwidth", "Group", "Point", "project", "fit_activations"]
