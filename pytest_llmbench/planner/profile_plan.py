"""The report's one question to the memory planner: "does each plan model fit, for every strategy and N,
on this profile?", asked with the profile's measured cases and answered as rows and sentences.

A GPU profile is planned as ``llmbench-plan --profile NAME --model MODEL`` plans it (memory_plan.py:
activations measured on each model's own architecture under FakeTensorMode at the profile's precision).
A CPU profile's activations are fitted on its own measured peaks, one fit per recompute setting
(projection.py ``fit_activations``; a CPU peak is process RSS, so the fit's intercept, the runtime, is a
term of its own), each measured case then checked against the fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.recompute import Recompute
from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.planner import memory as plan
from pytest_llmbench.planner import projection
from pytest_llmbench.planner.projection import MemoryCase

GIB = plan.GIB


@dataclass
class ProfilePlan:
    checks: list[dict] = field(default_factory=list)  # {"case", "error"}: the activation fit on each case
    rows: list[dict] = field(default_factory=list)  # {"model", "strategy", "memory": {N: GiB}, "fits_from"}
    lines: list[str] = field(default_factory=list)  # the verdicts, and what was not planned and why
    measured_models: bool = False  # activations measured on each plan model (a GPU profile)


def memory_case(result: BenchResult, peak_gib: float) -> MemoryCase | None:
    """A measured case with the planner's state at its activation peak (memory.py), as its peak counts
    it: a CPU case's peak RSS holds the pages written, a GPU's allocator every byte."""
    s = result.spec
    both = plan.of_run(s, resident=result.metrics.get("peak_memory_kind") == "cpu_peak_rss")
    if both is None:
        return None
    backward, _ = both
    return MemoryCase(s.case_id, s.world_size, backward.states,
                      s.micro_batch * s.seq_len * s.n_layer * s.n_embd, peak_gib * GIB)


def for_profile(profile, measured: list[tuple[BenchResult, float]], runtime: bool) -> ProfilePlan:
    """The plan of ``profile``'s plan models. ``measured``: its ok cases with their peak memory (GiB);
    ``runtime``: the peaks are process RSS (a CPU run), which holds the runtime beside the model."""
    out = ProfilePlan()
    by_ac: dict[Recompute, list[MemoryCase]] = {Recompute(): []}
    for result, peak_gib in measured:
        case = memory_case(result, peak_gib)
        if case:
            by_ac.setdefault(Recompute.of(result.spec.variant_parts()), []).append(case)
    fits = {ac: projection.fit_activations(cases, runtime_counted=runtime) for ac, cases in by_ac.items()}
    out.checks = [{"case": label, "error": error} for fit in fits.values() for label, _, error in
                  (fit.errors if fit else [])]
    if profile.device != "cpu":
        _as_the_cli(out, profile)
        return out
    fit = fits[Recompute()] or next((f for f in fits.values() if f), None)
    if fit is not None:
        _from_the_fit(out, profile, fit, runtime)
    return out


def _not_planned(out: ProfilePlan, profile, name: str) -> None:
    for strategy in profile.strategies:
        why = plan.why_unplanned(strategy)
        if why:
            out.lines.append(f"{profile.name}: {name}, {strategy}: {why}.")


def _plan_models(profile):
    """(model, workload, name) of each plan model the profile's workloads apply to."""
    for model in profile.plan_models or (profile.model,):
        for workload in profile.workloads:
            if RunSpec.from_preset(model).replace(workload=workload).workload_problem():
                continue  # lora/qlora of a GPT preset: nothing to plan
            yield model, workload, model if workload == "pretrain" else f"{model} {workload}"


def _row(out: ProfilePlan, profile, name: str, strategy: str, by_n: dict) -> str | None:
    """Adds the row; the verdict sentence where the profile declares its device's memory."""
    start = plan.fits_from(by_n, profile.memory_gib * GIB) if profile.memory_gib else None
    out.rows.append({"model": name, "strategy": strategy,
                     "memory": {n: e.total / GIB for n, e in by_n.items()}, "fits_from": start})
    return plan.sentence(strategy, by_n, profile.memory_gib) if profile.memory_gib else None


def _from_the_fit(out: ProfilePlan, profile, fit, runtime: bool) -> None:
    """A CPU profile: each plan model at the profile's micro-batch, grad_accum and longest sequence,
    activations from the fit on the profile's measured cases, for every strategy and N."""
    sizes = sorted({1, 2, 4, *profile.project_world_sizes})
    lora = {f"lora_{key}": value for key, value in profile.lora.items()}
    extra = (plan.Term("runtime", fit.intercept, "fitted: the peak beside state and activations",
                       state=False),)
    for model, workload, name in _plan_models(profile):
        seq = min(max(profile.seq_lens), RunSpec.from_preset(model).block_size)
        spec = RunSpec.from_preset(model, seq_len=seq, micro_batch=profile.micro_batch, **lora
                                   ).replace(workload=workload)
        units = spec.micro_batch * spec.seq_len * spec.n_layer * spec.n_embd
        _not_planned(out, profile, name)
        verdicts = []
        for strategy in profile.strategies:
            if plan.why_unplanned(strategy):  # said by _not_planned
                continue
            by_n = {n: plan.estimate(strategy, plan.Shape.of(spec), n, grad_accum=profile.grad_accum,
                                     activations=fit.per_unit * units, extra=extra, resident=runtime,
                                     foreach=not runtime)  # AdamW's for-loop on CPU, foreach on GPU
                    for n in sizes}
            verdicts.append(_row(out, profile, name, strategy, by_n))
        if profile.memory_gib and verdicts:
            out.lines.append(
                f"{profile.name}: {name} at micro-batch {spec.micro_batch} x grad_accum "
                f"{profile.grad_accum}, seq {spec.seq_len} on {profile.memory_gib:.3g} GiB devices, "
                f"estimated: "
                + "; ".join(verdicts) + ".")


def _as_the_cli(out: ProfilePlan, profile) -> None:
    """A GPU profile's plan models as ``llmbench-plan --profile NAME --model MODEL`` plans them."""
    from pytest_llmbench.planner import memory_plan

    out.measured_models = True
    for model, workload, name in _plan_models(profile):
        spec, rows, _ = memory_plan.for_profile(profile, model, workload)
        _not_planned(out, profile, name)
        verdicts = [_row(out, profile, name, row.strategy, row.by_n) for row in rows]
        if profile.memory_gib and verdicts:
            out.lines.append(
                f"{profile.name}: {name} at micro-batch {spec.micro_batch} x grad_accum "
                f"{profile.grad_accum}, seq {spec.seq_len}, {spec.dtype} on {profile.memory_gib:.3g} "
                f"GiB devices, estimated "
                f"with activations measured on {model} itself (as `llmbench-plan --profile {profile.name} "
                f"--model {model}`; {memory_plan.RESERVE_NOTE}): " + "; ".join(verdicts) + ".")
