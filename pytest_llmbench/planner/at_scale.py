"""The planner's one answer to the report's "what happens at N GPUs?" for one profile: each measured
scaling group projected from its own points (projection.py) and predicted on its part (predicted.py),
and the memory plan (profile_plan.py). The report (report/scale.py) turns stored results into these
inputs and this answer into its rows; it builds no model and does no arithmetic of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.planner import predicted, profile_plan, projection
from pytest_llmbench.planner.projection import Group
from pytest_llmbench.planner.step import Bandwidth
from pytest_llmbench.profiles import Profile


@dataclass(frozen=True)
class Measured:
    """One scaling group as it was measured: its points, and the spec and GPU of its largest run (the
    predictor's model, batch and variant, and which part of the device table it ran on)."""
    group: Group
    spec: RunSpec
    gpu_name: str = ""


@dataclass
class AtScale:
    projection: list[dict] = field(default_factory=list)  # projection.Row's fields, and the group's
    validation: list[dict] = field(default_factory=list)  # leave-one-out: each measured N from the rest
    predicted: list[dict] = field(default_factory=list)  # predicted.PredictedRow's fields
    notes: list[str] = field(default_factory=list)  # what was not projected, and why
    plan: profile_plan.ProfilePlan = field(default_factory=profile_plan.ProfilePlan)


def answer(profile: Profile, measured: list[Measured], sizes: list[int],
           link_for: Callable[[int], Bandwidth | None], peaks: list[tuple[BenchResult, float]],
           runtime: bool) -> AtScale:
    """Every measured group at ``sizes`` over ``link_for``'s bandwidth, and the memory plan asked with
    the profile's measured ``peaks`` (``runtime``: they are process RSS, profile_plan.for_profile)."""
    out = AtScale(plan=profile_plan.for_profile(profile, peaks, runtime=runtime))
    for m in measured:
        projected = projection.project(m.group, sizes, link_for)
        out.predicted += [dict(vars(row)) for row in
                          predicted.predicted_rows(m.group, m.spec, profile, sizes, m.gpu_name)]
        out.projection += [dict(vars(row), strategy_name=m.group.strategy, run_as=m.group.run_as,
                                seq_len=m.group.seq_len) for row in projected.rows]
        out.validation += [dict(vars(v)) for v in projected.validation]
        out.notes += projected.notes
    return out
