"""``llmbench-plan --mfu``: the step at a stated MFU. Compute = tokens x model FLOPs / (peak x MFU); the
strategy table's traffic over the link the flag or the profile declares (pytest_llmbench/planner/memory.py
``step_time``), none of it hidden unless ``--overlap`` says so. ``--time`` (planner/time_cli.py) predicts
the MFU instead.
"""

from __future__ import annotations

import argparse

from harness.spec import RunSpec
from pytest_llmbench.planner import mfu
from pytest_llmbench.profiles import Profile


def link_gbps(args: argparse.Namespace, profile: Profile | None, n: int) -> tuple[float | None, str]:
    """(busbw, where it came from) at N: the flag, else the profile's declared figure for a link within
    a node or across nodes at that N."""
    if args.busbw_gbps:
        return args.busbw_gbps, "--busbw-gbps"
    if profile is None:
        return None, "no --busbw-gbps"
    key = ("intra_node_busbw_gbps" if profile.devices_per_node == 0 or n <= profile.devices_per_node
           else "inter_node_busbw_gbps")
    value = profile.network.get(key)
    return value, f"declared {key} (profile {profile.name})" if value else f"profile has no {key}"


def step_times(args, profile: Profile | None, spec: RunSpec, rows: list) -> list[tuple]:
    """(strategy, grad_accum, {N: StepTime}, {N: link source}) for every strategy row and grad_accum."""
    out = []
    for row in rows:
        for accum in args.grad_accum:
            by_n, sources = {}, {}
            for n in args.world_size:
                gbps, source = link_gbps(args, profile, n)
                if n > 1 and not gbps:
                    raise ValueError(f"no bus bandwidth for N={n}: {source}; pass --busbw-gbps")
                by_n[n] = mfu.step_time(row, spec, n, grad_accum=accum, peak_flops=args.peak_tflops * 1e12,
                                         mfu=args.mfu, busbw_gbps=gbps or 1.0, overlap=args.overlap)
                sources[n] = source if n > 1 else "-"
            out.append((row.name, accum, by_n, sources))
    return out


def print_times(args, times: list[tuple]) -> None:
    print(f"\nEstimated step time (s) and samples/s: model FLOPs at MFU {args.mfu:.0%} (stated) of "
          f"{args.peak_tflops:g} TFLOP/s, the strategy's traffic formula over the link (bandwidth only), "
          f"{args.overlap:.0%} of compute hiding it.")
    sizes = args.world_size
    print(f"{'strategy':<10}{'accum':>6}" + "".join(f"{'N=' + str(n):>18}" for n in sizes))
    for name, accum, by_n, _ in times:
        print(f"{name:<10}{accum:>6}" + "".join(f"{by_n[n].step_s:>9.3f}{by_n[n].samples_per_s:>9.2f}"
                                                for n in sizes))
    links = {src for _, _, _, sources in times for src in sources.values() if src != "-"}
    print(f"links: {'; '.join(sorted(links)) or 'none (N=1)'}")
    for name, accum, by_n, _ in times:
        largest = by_n[max(sizes)]
        print(f"- {name} grad_accum {accum} at N={largest.world_size}: {largest.describe()}")


def time_json(t: mfu.StepTime, link: str) -> dict:
    return {"step_s": t.step_s, "compute_s": t.compute_s, "comm_s": t.comm_s, "exposed_s": t.exposed_s,
            "samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s, "busbw_gbps": t.busbw_gbps,
            "link": link}
