"""The report's answer to "what happens at N GPUs?": the collectives probe's tables, the projection
of every measured strategy to the profile's ``project_world_sizes`` with its leave-one-out
validation, and the memory-fit planner. The arithmetic is the planner's, asked once per profile
(pytest_llmbench/planner/at_scale.py); this module turns stored results and profiles into its inputs
(the scaling groups, the links the probes measured) and its answer into table rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harness import shapes, strategies, traffic
from harness.bandwidth import OPS
from harness.result import BenchResult
from pytest_llmbench.planner import at_scale
from pytest_llmbench.planner.projection import Group, Point
from pytest_llmbench.planner.step import Bandwidth
from pytest_llmbench.profiles import Profile
from pytest_llmbench.report.load import Loaded


@dataclass
class Scale:
    collectives: list[dict] = field(default_factory=list)  # one row per profile and probe world size
    traffic: list[dict] = field(default_factory=list)  # one row per case with measured traffic
    nominal: dict[str, dict[str, float]] = field(default_factory=dict)  # profile -> declared [network]
    projection: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    memory_check: list[dict] = field(default_factory=list)
    plan: list[dict] = field(default_factory=list)
    plan_lines: list[str] = field(default_factory=list)
    plan_measured: list[str] = field(default_factory=list)  # profiles planned as llmbench-plan plans them
    predicted: list[dict] = field(default_factory=list)  # the step-time predictor beside the projection


def build_scale(loaded: Loaded, profiles: dict[str, Profile], world_sizes: Sequence[int] | None = None,
                ) -> Scale:
    """Everything of this module for the loaded results; ``world_sizes`` overrides the profiles'
    ``project_world_sizes`` (``llmbench-report --project``)."""
    scale = Scale(collectives=collective_rows(loaded.probes), traffic=traffic_rows(loaded))
    names = sorted({p for p, _ in loaded.probes} | set(loaded.frame.profile.unique()))
    for name in names:
        profile = profiles.get(name)
        if profile is None:
            scale.notes.append(f"{name}: no profile of this name is loaded; not projected (pass its file "
                               f"with --llmbench-profile-file / --profile-file)")
            continue
        scale.nominal[name] = dict(profile.network)
        link_for = links(profile, [r for p, r in loaded.probes if p == name and r.ok])
        frame = loaded.frame[(loaded.frame.profile == name) & (loaded.frame.status == "ok")]
        peaks = [(loaded.results[r.run_ids[0]], float(r.peak_memory_gib)) for r in frame.itertuples()
                 if not _missing(r.peak_memory_gib)]
        answer = at_scale.answer(profile, [_measured(loaded, profile, g) for g in groups(loaded, profile)],
                                 list(world_sizes or profile.project_world_sizes), link_for, peaks,
                                 runtime=bool((frame.peak_memory_kind == "cpu_peak_rss").any()))
        scale.predicted += [dict(row, profile=name) for row in answer.predicted]
        scale.projection += [dict(row, profile=name) for row in answer.projection]
        scale.validation += [dict(v, profile=name) for v in answer.validation]
        scale.notes += [f"{name}: {note}" for note in answer.notes]
        scale.notes += _not_in_table(loaded, name)
        scale.memory_check += [{"profile": name, **check} for check in answer.plan.checks]
        scale.plan += [{"profile": name, **row} for row in answer.plan.rows]
        scale.plan_lines += answer.plan.lines
        if answer.plan.measured_models:
            scale.plan_measured.append(name)
    return scale


def _not_in_table(loaded: Loaded, profile: str) -> list[str]:
    """A note per stored strategy this process's strategy table does not have (a plugin's, the plugin
    absent where the report is rebuilt): reported as measured, neither projected nor planned."""
    rows = loaded.frame[loaded.frame.profile == profile]
    names = sorted(set(rows.strategy_name))
    return [f"{profile}: {name} is not in this table (harness/strategies.py: its plugin is not loaded "
            f"here); its measurements are reported, not projected or planned" for name in names
            if strategies.find(name) is None]


def collective_rows(probes: list[tuple[str, BenchResult]]) -> list[dict]:
    rows = []
    for profile, r in probes:
        row = {"profile": profile, "world_size": r.spec.world_size, "nnodes": r.spec.nnodes,
               "status": r.status, "size_bytes": r.metrics.get("busbw_size_bytes"), "rows": r.collectives,
               "device_name": r.env.get("device_name", "")}
        for op in OPS:
            row[f"busbw_gbps_{op}"] = r.metrics.get(f"busbw_gbps_{op}")
            row[f"latency_s_{op}"] = r.metrics.get(f"latency_s_{op}")
        rows.append(row)
    return rows


def traffic_rows(loaded: Loaded) -> list[dict]:
    """Per case (its first ok trial) the measured bytes of one step: per collective the bytes of the
    whole arrays, the bus bytes each rank moves at its N (nccl-tests' convention), that over DDP's of
    the same profile, workload, N and sequence length, and the messages by size."""
    frame = loaded.frame[loaded.frame.status == "ok"]
    cases = [(row.profile, runs[0]) for row in frame.itertuples() if (runs := _recorded(loaded, row.run_ids))]
    rows = []
    for profile, r in cases:
        s, messages = r.spec, traffic.bulk(r.traffic)
        sizes = sorted(m["bytes"] for m in messages)
        rows.append({"profile": profile, "case": r.case_id, "world_size": s.world_size,
                     "grad_accum": s.grad_accum,
                     "key": (profile, s.workload, s.world_size, s.seq_len),
                     "is_ddp": s.strategy == strategies.REPLICA and s.variant == "base",
                     "bytes_by_op": traffic.bytes_by_op(r.traffic),
                     "bus_bytes": traffic.bus_bytes(messages, s.world_size),
                     "messages": sum(m["count"] for m in messages),
                     "smallest": sizes[0] if sizes else 0, "largest": sizes[-1] if sizes else 0,
                     "control": sum(m["count"] for m in r.traffic) - sum(m["count"] for m in messages)})
    ddp = {row["key"]: row["bus_bytes"] for row in rows if row["is_ddp"]}
    for row in rows:
        base = ddp.get(row.pop("key"))
        row["vs_ddp"] = row["bus_bytes"] / base if base else None
    return rows


def links(profile: Profile, probes: list[BenchResult]) -> Callable[[int], Bandwidth | None]:
    """The bandwidth at N ranks: within a node (or on a profile whose ranks share a host) the largest
    single-node probe, else the declared intra-node figure; across nodes the largest multi-node
    probe, else the declared inter-node figure; None when neither exists."""
    def measured(multi: bool) -> Bandwidth | None:
        chosen = [r for r in probes if (r.spec.nnodes > 1) == multi]
        if not chosen:
            return None
        r = max(chosen, key=lambda p: p.spec.world_size)
        rows = {op: [(row["size_bytes"], row["busbw_gbps"]) for row in r.collectives if row["op"] == op]
                for op in OPS}
        where = f"{r.spec.nnodes} nodes" if multi else "one node"
        return Bandwidth(f"measured (probe ws{r.spec.world_size}, {where})", rows,
                         world_size=r.spec.world_size)

    def declared(key: str) -> Bandwidth | None:
        value = profile.network.get(key)
        return Bandwidth(f"declared ({key} = {value:g} GB/s)", declared_gbps=value) if value else None

    intra = measured(False) or declared("intra_node_busbw_gbps")
    inter = measured(True) or declared("inter_node_busbw_gbps")

    def link_for(n: int) -> Bandwidth | None:
        one_node = profile.devices_per_node == 0 or n <= profile.devices_per_node
        return intra if one_node else inter
    return link_for


def _measured(loaded: Loaded, profile: Profile, group: Group) -> at_scale.Measured:
    """The group, with the spec of its largest measured run and the GPU its driver named."""
    frame = loaded.frame[(loaded.frame.profile == profile.name) & (loaded.frame.status == "ok")]
    runs = [loaded.results[r.run_ids[0]] for r in frame.itertuples() if r.run_ids]
    run = max((r for r in runs if r.spec.run_as == group.run_as and r.spec.seq_len == group.seq_len),
              key=lambda r: r.spec.world_size)
    return at_scale.Measured(group, run.spec, str(run.env.get("device_name") or ""))


def groups(loaded: Loaded, profile: Profile) -> list[Group]:
    """One projection group per scaling group of the profile (RunSpec.scaling_identity): a strategy
    as run, workload and sequence length, and its measured world sizes."""
    frame = loaded.frame[(loaded.frame.profile == profile.name) & (loaded.frame.status == "ok")]
    out = []
    for _, g in frame.sort_values(["strategy", "seq_len"], kind="stable").groupby("scaling_key", sort=False):
        first = g.iloc[0]
        spec = loaded.results[first.run_ids[0]].spec
        row = strategies.find(spec.strategy)  # resolved here, once: the projection takes the row
        if row is None:
            continue  # a plugin's strategy, its plugin absent: said by build_scale (_not_in_table)
        points = [Point(int(r.world_size), float(r.step_time_median_s),
                        None if _missing(r.compute_only_step_time_s) else float(r.compute_only_step_time_s),
                        int(r.tokens_per_step), int(r.grad_accum)) for r in g.itertuples()]
        recorded = _traffic_of(loaded, g)
        out.append(Group(
            label=f"{spec.run_as} seq{spec.seq_len}", strategy=spec.strategy, run_as=spec.run_as, row=row,
            variant_parts=frozenset(spec.variant_parts()), points=points,
            traffic=recorded.traffic if recorded else [],
            traffic_micro_batches=recorded.spec.grad_accum if recorded else 1,
            payloads=shapes.payloads(spec), baseline_world_size=profile.baseline_world_size,
            usd_per_device_hour=profile.usd_per_device_hour, seq_len=spec.seq_len,
            global_batch_tokens=profile.global_batch_tokens or None))
    return out


def _recorded(loaded: Loaded, run_ids) -> list[BenchResult]:
    """The ok runs among ``run_ids`` that recorded traffic above one rank (nothing crosses a link
    at ws1), first trial first."""
    runs = [loaded.results[run_id] for run_id in run_ids]
    return sorted((r for r in runs if r.ok and r.traffic and r.spec.world_size > 1), key=lambda r: r.trial)


def _traffic_of(loaded: Loaded, g) -> BenchResult | None:
    """The result whose measured messages stand for the group: its smallest world size above 1."""
    runs = _recorded(loaded, [run_id for ids in g.run_ids for run_id in ids])
    return min(runs, key=lambda r: r.spec.world_size) if runs else None


def _missing(value) -> bool:
    return value is None or value != value  # None or NaN

