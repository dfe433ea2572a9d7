"""The step-time predictor beside the projection (issue 44): on a GPU profile whose device is one part of
the device table, each projected strategy's step as ``llmbench-plan --time`` predicts it for that part
and the profile's links (pytest_llmbench/planner/steptime.py: the same model), calibrated by the group's
measured points: scaled by measured / predicted at its largest measured world size. A CPU profile has no
part in the table, and its projection stays the measured points' extrapolation alone (projection.py).
"""

from __future__ import annotations

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
    """(the device table's part the run's GPU is, by the name its driver reported (devices.by_gpu_name,
    the table's one name-to-part function), else the profile's one part; or None, and why not)."""
    if profile.device == "cpu":
        return None, "a CPU profile: no part of the device table"
    part = devices.by_gpu_name(gpu_name) if gpu_name else None
    if part is not None:
        return part, ""
    if len(profile.parts) != 1:
        names = ", ".join(profile.parts) or "none"
        return None, (f"the profile names {len(profile.parts)} parts of the device table ({names}): say "
                      f"which with llmbench-plan --device")
    return devices.DEVICES[profile.parts[0]], ""


def predicted_rows(group: Group, spec: RunSpec, profile: Profile, sizes: list[int],
                   gpu_name: str = "") -> list[PredictedRow]:
    """The group's step at its measured and projected world sizes on the run's part, calibrated by
    its largest measured point; [] where there is no part or the strategy is not in the table."""
    part, _ = part_of(profile, gpu_name)
    unknown = spec.strategy not in strategies.names()
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
