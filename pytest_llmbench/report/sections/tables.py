"""The report's case tables: every case (its columns from the metric table), the trials, the
variants, the workloads and the scaling efficiency per world size."""

from __future__ import annotations

import pandas as pd

from harness import metrics
from harness.flops import FLOPS_FORMULA_FROZEN
from pytest_llmbench import stats
from pytest_llmbench.report.findings import MEMORY_TIE
from pytest_llmbench.report.load import Loaded
from pytest_llmbench.report.sections import Section, Variables, View
from pytest_llmbench.report.sections.fmt import num, row, with_interval
from pytest_llmbench.report.variants import variant_rows
from pytest_llmbench.report.workloads import workload_rows

NEEDED_FOR = 0.05  # the Trials table says how many trials would separate a difference this large
# the All cases table's columns around the metric table's (its rows with a ``column``)
LEADING = (("profile", "profile"), ("strategy", "strategy"), ("ws", "world_size"), ("seq", "seq_len"),
           ("trials ok", "trials"))
TRAILING = (("status", "status"),)


def cases(view: View) -> Variables:
    """Every case: the leading columns, each metric with a ``column`` in table order, its status."""
    shown = [*LEADING, *((m.column, m.name) for m in metrics.table() if m.column), *TRAILING]
    return {"confidence": f"{stats.CONFIDENCE:.0%}", "headers": [header for header, _ in shown],
            "rows": [[r.get(key, "-") for _, key in shown]
                     for r in map(row, view.loaded.frame.to_dict("records"))]}


def trials(view: View) -> Variables:
    """Cases with two or more ok trials: each trial's tokens/s, the mean, its interval, the cv,
    and the trials per side that would separate a NEEDED_FOR difference at that cv."""
    rows = []
    frame = view.loaded.frame
    for r in frame[pd.to_numeric(frame.case_trials_ok) > 1].itertuples():
        cv = r.case_tokens_per_s_cv
        rows.append({"case": f"{r.profile}-{r.case_id}",
                     "trials": f"{r.case_trials_ok} of {r.case_trials}",
                     "per_trial": ", ".join(f"{v:,.0f}" for v in r.trials_tokens_per_s),
                     "mean": with_interval(r.case_tokens_per_s_mean, r.case_tokens_per_s_ci_low,
                                           r.case_tokens_per_s_ci_high, "{:,.0f}"),
                     "median": num(r.case_tokens_per_s_median, "{:,.0f}"), "cv": num(cv, "{:.1%}"),
                     "slot": num(r.case_mean_slot, "{:.1f}"),
                     "needed": (stats.trials_needed(cv, NEEDED_FOR) if cv else None) or "-"})
    return {"trial_rows": rows, "confidence": f"{stats.CONFIDENCE:.0%}", "needed_for": f"{NEEDED_FOR:.0%}",
            "noise": f"{stats.NOISE:.0%}"}


def variants(view: View) -> Variables:
    formats = {"overhead": "{:.1%}", "base_overhead": "{:.1%}", "loss_gap": "{:.1e}",
               "loss_last_delta": "{:+.1e}", "compile_s": "{:.1f}", "recompiles": "{:.0f}",
               "graph_breaks": "{:.0f}", "compile_cache_hits": "{:.0%}", "pays_off_after": "{:,.0f}"}
    rows = [{**v, **{key: num(v[key], fmt) if key in v else "" for key, fmt in formats.items()}}
            for v in variant_rows(view.loaded)]
    return {"variant_rows": rows, "compiled_rows": [v for v in rows if v["compiled"]],
            "memory_tie": f"{MEMORY_TIE:.0%}"}


def workloads(view: View) -> Variables:
    return {"workload_rows": [row(r) for r in workload_rows(view.loaded)],
            "frozen_formula": FLOPS_FORMULA_FROZEN}


def scaling(view: View) -> Variables:
    baselines = sorted({int(v) for v in view.loaded.frame.scaling_baseline_world_size.dropna()})
    return {"baseline_ws": ", ".join(map(str, baselines)) or "none measured",
            "scaling_tables": scaling_tables(view.loaded),
            "confidence": f"{stats.CONFIDENCE:.0%}", "paired_method": stats.PAIRED_METHOD,
            "ratio_method": stats.RATIO_METHOD}


def scaling_tables(loaded: Loaded) -> list[dict]:
    """Per profile, sequence length and workload: each strategy's efficiency per world size."""
    tables = []
    for (profile, seq_len, workload), group in loaded.frame.groupby(["profile", "seq_len", "workload"]):
        sizes = sorted(group.world_size.unique())
        rows = []
        for strategy, g in group.groupby("strategy"):
            by_ws = {r.world_size: with_interval(r.scaling_efficiency, r.case_scaling_efficiency_ci_low,
                                                 r.case_scaling_efficiency_ci_high, "{:.2f}")
                     for r in g.itertuples()}
            rows.append({"strategy": strategy, "cells": [by_ws.get(ws, "-") for ws in sizes]})
        strong = (group.scaling == "strong").any()
        kind = "strong scaling (same global batch)" if strong else "weak scaling (same per-device batch)"
        title = f"{profile}, seq {seq_len}" + ("" if workload == "pretrain" else f", {workload}")
        tables.append({"title": f"{title}: {kind}", "world_sizes": sizes, "rows": rows})
    return tables


SECTIONS = (Section("cases", cases), Section("trials", trials), Section("variants", variants),
            Section("workloads", workloads), Section("scaling", scaling))
