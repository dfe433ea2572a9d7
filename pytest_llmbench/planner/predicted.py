"""The step-time predictor beside the projection (issue 44): on a GPU profile whose device is one part of
the device table, each projected strategy's step as ``llmbench-plan --time`` predicts it for that part
and the profile's links (pytest_llmbench/planner/steptime.py: the same model), calibrated by the group's
measured points: scaled by measured / predicted at its largest measured world size. A CPU profile has no
part in the table, and its projection stays the measured points' extrapolation alone (projection.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness import devices, strategies
from harness.spec import RunSpec
from pytest_llmbench.planner import step, timing
from pytest_llmbench.planner.projection import Group
from pytest_llmbench.profiles import Profile


@dataclass(frozen=True)
class PredictedRow:
    label: str
    world_size: int
    predicted_step_s: float  # the predictor's step, uncalibrated
    calibrated_step_s: float  # x measured / predicted at the calibration point
    calibrated_on: str  # e.g. "measured N=2 (x1.08)"


def part_of(profile: Profile, gpu_name: str = "") -> tuple[devices.Device | None, str]:
    """(the device table's part the run's GPU is, by the name its driver reported, else the one part
    the profile's device_names match; or None, and why not)."""
    if profile.device == "cpu":
        return None, "a CPU profile: no part of the device table"
    parts = [d for d in devices.DEVICES.values() if d.gpu_name and re.search(d.gpu_name, gpu_name or "")]
    if not parts:
        parts = [d for d in devices.DEVICES.values()
                 if any(re.search(pattern, d.label, re.IGNORECASE) for pattern in profile.device_names)]
    if len(parts) != 1:
        names = ", ".join(d.name for d in parts) or "none"
        return None, (f"its device_names match {len(parts)} parts of the device table ({names}): say which "
                      f"with llmbench-plan --device")
    return parts[0], ""


def predicted_rows(group: Group, spec: RunSpec, profile: Profile, sizes: list[int],
                   gpu_name: str = "") -> list[PredictedRow]:
    """The group's step at its measured and projected world sizes on the run's part, calibrated by
    its largest measured point; [] where there is no part or the strategy is not in the table."""
    part, _ = part_of(profile, gpu_name)
    unknown = strategies.find(spec.strategy) is None
    if part is None or unknown or not group.points or spec.workload != "pretrain":
        return []  # (--time models pre-training only: llmbench-plan says why for lora and qlora)
    across = profile.network.get("inter_node_busbw_gbps")  # declared; without it, one node's sizes only
    per_node = profile.devices_per_node or max(sizes + [p.world_size for p in group.points])
    network = step.Network(per_node, None, across)
    if not across:
        sizes = [n for n in sizes if n <= per_node]
    if timing.problem(spec, max(sizes + [p.world_size for p in group.points]), per_node):
        return []  # a variant the predictor does not time (offload, powersgd)

    def predict(n: int) -> float:
        return timing.predict(spec, part, network, world_size=n, grad_accum=spec.grad_accum).step_time_s

    anchor = max(group.points, key=lambda p: p.world_size)
    steps = {n: predict(n) for n in sorted({p.world_size for p in group.points} | set(sizes))}
    factor = anchor.step_s / steps[anchor.world_size]
    on = f"measured N={anchor.world_size} (x{factor:.2f})"
    return [PredictedRow(group.label, n, step, factor * step, on) for n, step in steps.items()]
