"""Projection to world sizes that were not measured, and the activation fit of the memory planner
(whose state terms are pytest_llmbench/plan.py). Pure: no torch,
no pandas; every input is a number that was measured, or a figure labelled as declared.

Step time at N ranks, per strategy (all times per optimizer step, medians):

    step(N)     = compute(N) + wrapper + exposed(N)
    compute(N)  = compute-only step at the baseline N0 x tokens per rank at N / at N0
    wrapper     = step(N0) - compute-only(N0), or 0 if that is negative (noise)   (harness/derive.py)
    comm(N)     = sum over the strategy's collectives of  count x bus_factor(op, N) x S / busbw(op, S)
    exposed(N)  = max(0, comm(N) - overlap x compute(N))

``busbw`` is the collectives probe's, at that message size (log-interpolated between measured
sizes), within a node; across nodes the probe of a multi-node world size, else the profile's
declared link figure. Busbw does not depend on N for ring algorithms (nccl-tests
doc/PERFORMANCE.md), which is what carries a ws2 probe to 256 ranks; the latency that grows
with N (2(N-1) ring steps) is only in the probe's busbw at small sizes, so projections of
latency-bound steps are optimistic. ``exposed`` is Calculon's rule (Isaacs et al., SC'23):
communication overlapped with compute costs only what the compute cannot hide. ``overlap``
is fitted on the measured world sizes above N0 (0 when there is none: nothing hidden).

What each strategy sends per micro-batch and per step, and what it shards, is its row in the
strategy table (harness/strategies.py); a strategy not in the table is an error, never projected
with another's numbers. Variants whose traffic the table does not describe (offload, powersgd,
hsdp: ``Variant.projected``) are not projected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import strategies
from harness.bandwidth import OPS, bus_factor
from harness.strategies import VARIANTS

DEFAULT_WORLD_SIZES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Bandwidth:
    """busbw (GB/s) per collective as a function of message size: measured rows, or one declared figure."""

    source: str  # e.g. "measured (probe ws2)" or "declared (profile [network])"
    rows: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # op -> [(size, busbw)]
    declared_gbps: float | None = None

    def busbw_gbps(self, op: str, size_bytes: float) -> float:
        if self.declared_gbps is not None:
            return self.declared_gbps
        points = sorted(self.rows[op])
        if size_bytes <= points[0][0]:
            return points[0][1]
        for (s0, b0), (s1, b1) in zip(points, points[1:], strict=False):
            if size_bytes <= s1:
                x = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + x * (b1 - b0)
        return points[-1][1]


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
    n_params: int
    n_trainable: int
    points: list[Point]
    baseline_world_size: int = 1
    usd_per_device_hour: float | None = None
    global_batch_tokens: int | None = None  # strong scaling; None: the largest measured step's tokens
    seq_len: int = 1
    run_as: str = ""  # RunSpec.run_as: the strategy as run, as the report's rows name it


def traffic(group: Group, micro_batches: int) -> list[tuple[str, float, int]]:
    """(op, bytes of the whole array, times per step) of one optimizer step, from the strategy's row."""
    _, sends = strategies.get(group.strategy).layout(group.variant_parts)
    grad_bytes = 2 if "bf16-reduce" in group.variant_parts else 4
    return [(send.op, send.payload_bytes(n_params=group.n_params, n_trainable=group.n_trainable,
                                         grad_bytes=grad_bytes), send.count(micro_batches)) for send in sends]


def comm_s(group: Group, world_size: int, micro_batches: int, link: Bandwidth) -> float:
    if world_size == 1:
        return 0.0
    return sum(count * bus_factor(op, world_size) * size / (link.busbw_gbps(op, size) * 1e9)
               for op, size, count in traffic(group, micro_batches))


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

    def step(self, world_size: int, tokens_per_rank: float, overlap: float) -> tuple[float, float]:
        """(step seconds, exposed communication seconds)."""
        compute = self.base.compute_s * tokens_per_rank / self.tokens0
        micro = max(1, math.ceil(tokens_per_rank / self.micro_tokens - 1e-9))
        link = self.link_for(world_size)
        comm = comm_s(self.group, world_size, micro, link) if link else 0.0
        exposed = max(0.0, comm - overlap * compute)
        return compute + self.wrapper + exposed, exposed

    def overlap_from(self, points: list[Point]) -> float | None:
        """Mean over ``points`` of the share of compute that hid communication, clamped to [0, 1]."""
        shares = []
        for p in points:
            link = self.link_for(p.world_size)
            if p.compute_s is None or link is None:
                continue
            comm = comm_s(self.group, p.world_size, p.grad_accum, link)
            exposed = (p.step_s - p.compute_s) - self.wrapper
            if comm > 0:
                shares.append(min(1.0, max(0.0, (comm - exposed) / p.compute_s)))
        return sum(shares) / len(shares) if shares else None


def project(group: Group, world_sizes: list[int], link_for: Callable[[int], Bandwidth | None]) -> Projection:
    out = Projection()
    bases = [p for p in group.points if p.world_size == group.baseline_world_size and p.compute_s]
    if not bases:
        out.notes.append(f"{group.label}: no measured ws{group.baseline_world_size} baseline with a "
                         f"compute-only step; not projected")
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


# ---- activations of the memory planner (its state terms: pytest_llmbench/plan.py) ----------

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
