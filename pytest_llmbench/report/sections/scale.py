"""The report's sections past what was measured: the collectives probe, the traffic each strategy
sent, the projection to larger world sizes and its validation, the step-time model and the memory
fit (report/scale.py computes them once per report, into ``loaded.scale``; each section here
formats its own part). A part's variables are one ``scale`` mapping, as the templates read it."""

from __future__ import annotations

from harness.bandwidth import OPS
from pytest_llmbench.report.sections import Section, Variables, View
from pytest_llmbench.report.sections.fmt import num

PROJECTED = (("step_s", "{:.4g}"), ("measured_step_s", "{:.4g}"), ("tokens_per_s", "{:,.0f}"),
             ("weak_efficiency", "{:.2f}"), ("strong_efficiency", "{:.2f}"), ("exposed_comm_share", "{:.1%}"),
             ("usd_per_million_tokens", "{:.4f}"))


def collectives(view: View) -> Variables:
    """Per message size, each op's bus bandwidth (GB/s) and latency (us); the profiles' nominal links."""
    scale = view.loaded.scale
    rows = [{**r, "size": num(r["size_bytes"], "{:,}"), **{
        f"{op}_{kind}": num(r[f"{kind}_{op}"] if kind == "busbw_gbps" else r[f"{kind}_{op}"] and
                            r[f"{kind}_{op}"] * 1e6, fmt)
        for op in OPS for kind, fmt in (("busbw_gbps", "{:.3g}"), ("latency_s", "{:.0f}"))}}
        for r in scale.collectives]
    nominal = [f"{p}: {', '.join(f'{k} = {v:g} GB/s' for k, v in n.items())}"
               for p, n in scale.nominal.items() if n]
    return {"scale": {"collectives": rows, "nominal": nominal}}


def traffic(view: View) -> Variables:
    """Per case, the megabytes each op sent in one step, the bus bytes and the ratio to DDP's."""
    rows = [{**r, **{f"{op}_mb": num(r["bytes_by_op"][op] / 1e6 if op in r["bytes_by_op"] else None, "{:.3g}")
                     for op in OPS},
             "bus_mb": f"{r['bus_bytes'] / 1e6:.3g}", "vs_ddp": num(r["vs_ddp"], "{:.2f}x"),
             "sizes": (f"{r['smallest'] / 1e6:.3g}" if r["smallest"] == r["largest"]
                       else f"{r['smallest'] / 1e6:.3g} - {r['largest'] / 1e6:.3g}")}
            for r in view.loaded.scale.traffic]
    return {"scale": {"traffic": rows}}


def projection(view: View) -> Variables:
    scale = view.loaded.scale
    return {"scale": {
        "projection": [{**r, **{k: num(r[k], f) for k, f in PROJECTED}} for r in scale.projection],
        "validation": [{**v, "predicted_s": f"{v['predicted_s']:.4g}", "measured_s": f"{v['measured_s']:.4g}",
                        "error": f"{v['error']:+.1%}"} for v in scale.validation],
        "notes": scale.notes}}


def predicted(view: View) -> Variables:
    return {"scale": {"predicted": [{**p, "predicted_step_s": f"{p['predicted_step_s']:.4g}",
                                     "calibrated_step_s": f"{p['calibrated_step_s']:.4g}"}
                                    for p in view.loaded.scale.predicted]}}


def memory_fit(view: View) -> Variables:
    scale = view.loaded.scale
    sizes = sorted({n for row in scale.plan for n in row["memory"]})
    return {"scale": {
        "memory_sizes": sizes, "plan_lines": scale.plan_lines, "plan_measured": scale.plan_measured,
        "plan": [{**r, "cells": [f"{r['memory'][n]:.1f}" for n in sizes]} for r in scale.plan],
        "memory_check": [{**c, "error": f"{c['error']:+.1%}"} for c in scale.memory_check],
        "memory_error": (f"{max(abs(c['error']) for c in scale.memory_check):.1%}" if scale.memory_check
                         else None)}}


SECTIONS = (Section("collectives", collectives), Section("traffic", traffic),
            Section("projection", projection), Section("predicted", predicted),
            Section("memory_fit", memory_fit))
