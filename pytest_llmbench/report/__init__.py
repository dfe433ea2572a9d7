"""The report: stored results -> OUTPUT/report/{metrics.csv, plots/*.png, REPORT.md, REPORT.html}.

Used by ``pytest --llmbench-report``, at the end of a session that ran cases, and by the
``llmbench-report`` console script. Reads JSON only; never runs a benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import pandas as pd

from harness import metrics
from harness.bandwidth import OPS
from harness.flops import FLOPS_FORMULA_FROZEN
from harness.transport import write_atomic
from pytest_llmbench import stats
from pytest_llmbench.profiles import Profile, load_profiles
from pytest_llmbench.report import escape
from pytest_llmbench.report.escape import Markdown
from pytest_llmbench.report.findings import (
    MEMORY_TIE,
    STRAGGLER_RATIO,
    STRAGGLER_SHARE,
    caveats,
    recommendations,
    stragglers,
    winners,
)
from pytest_llmbench.report.html import render_html
from pytest_llmbench.report.load import Loaded, ReportError, columns, load_results
from pytest_llmbench.report.memory import COLUMNS, PLANNED, memory_rows
from pytest_llmbench.report.plots import make_plots
from pytest_llmbench.report.scale import build_scale
from pytest_llmbench.report.traces import trace_rows
from pytest_llmbench.report.variants import variant_rows
from pytest_llmbench.report.workloads import workload_rows

TEMPLATES = Path(__file__).resolve().parent / "templates"
# strategy_config keys the "What each strategy really ran" table shows
DETAILS = ("compute_probe_precision", "wrap_policy", "sharding_strategy", "reshard_after_forward",
           "root_reshard_after_forward", "bucket_cap_mb", "comm_hook", "mp_policy", "mixed_precision",
           "offload_policy", "cpu_offload", "device_mesh")
NEEDED_FOR = 0.05  # the Trials table says how many trials would separate a difference this large
__all__ = ["ReportError", "build_report"]


def build_report(output: str | Path, *, echo: Callable[[str], None] = print,
                 fail_on_empty: bool = False, sessions: Sequence[str] = (),
                 profiles: dict[str, Profile] | None = None, project: Sequence[int] | None = None) -> int:
    """Write the report for every result stored under ``output`` (or only ``sessions``);
    the exit code. No results: a message and exit 0 with nothing written (1 with
    ``fail_on_empty``). A session that is not stored raises ReportError. ``profiles`` (default:
    the built-in ones) give the projection its world sizes, links and device memory; ``project``
    overrides their ``project_world_sizes``.
    """
    output = Path(output)
    loaded = load_results(output, sessions)
    if loaded.frame.empty:
        probes = f" (only {len(loaded.probes)} collectives probe(s))" if loaded.probes else ""
        echo(f"llmbench: no stored results under {output / 'results'}; no report written{probes}")
        return 1 if fail_on_empty else 0
    loaded.scale = build_scale(loaded, profiles if profiles is not None else load_profiles([]), project)
    report_dir = output / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    # every file through write_atomic: a symlink planted at its path is replaced, never followed
    cells = loaded.trials[columns()].map(escape.csv_cell)  # stored text a spreadsheet would run
    write_atomic(report_dir / "metrics.csv", cells.to_csv(index=False))
    plots = make_plots(loaded, report_dir / "plots")
    markdown = render_markdown(loaded, plots, output)
    write_atomic(report_dir / "REPORT.md", markdown)
    write_atomic(report_dir / "REPORT.html", render_html(markdown, report_dir))
    echo(f"llmbench: report of {len(loaded.frame)} case(s) written to {report_dir / 'REPORT.md'} "
         f"(and REPORT.html)")
    return 0


def render_markdown(loaded: Loaded, plots: dict[str, str], output: Path) -> str:
    frame = loaded.frame
    # every printed string is escaped for markdown unless the report wrote it as Markdown (escape.py)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, finalize=escape.finalize)
    env.filters["code"] = escape.code
    return env.get_template("REPORT.md.j2").render(
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        n_cases=len(frame), n_failed=int((frame.status != "ok").sum()),
        results_dir=output / "results", first_run=frame.created_utc.min()[:19],
        last_run=frame.created_utc.max()[:19], environment=_environment(loaded),
        strategy_rows=_strategy_rows(loaded), shared_config=_shared_config(loaded),
        winners=winners(frame), memory_tie=f"{MEMORY_TIE:.0%}", recommendations=recommendations(frame),
        rows=[_fmt_row(r) for r in frame.to_dict("records")],
        baseline_ws=_baseline_ws(frame), scaling_tables=_scaling_tables(frame),
        variant_rows=[_fmt_variant(v) for v in variant_rows(loaded)],
        workload_rows=[_fmt_row(r) for r in workload_rows(loaded)], frozen_formula=FLOPS_FORMULA_FROZEN,
        trial_rows=_trial_rows(loaded), noise=f"{stats.NOISE:.0%}", ratio_method=stats.RATIO_METHOD,
        paired_method=stats.PAIRED_METHOD,
        confidence=f"{stats.CONFIDENCE:.0%}", needed_for=f"{NEEDED_FOR:.0%}",
        cost_rows=[_fmt_row(r) | {"energy_note": _energy_note(loaded, r)}
                   for r in frame[frame.status == "ok"].to_dict("records")],
        trace_rows=_trace_rows(loaded), straggler_rows=_straggler_rows(loaded),
        memory_rows=_memory_rows(loaded),
        straggler_ratio=f"{STRAGGLER_RATIO:.2f}",
        straggler_share=f"{STRAGGLER_SHARE:.0%}",
        scale=_fmt_scale(loaded.scale), plots=plots, caveats=caveats(loaded))


def _trace_rows(loaded: Loaded) -> list[dict]:
    """The Trace section's rows, formatted: milliseconds per step and shares."""
    def ms(value) -> str:
        return _num(value if value is None else value * 1e3, "{:.1f}")

    return [{**r, **{k: ms(r[k]) for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s",
                                            "measured_step_s")},
             **{k: _num(r[k], "{:.1%}") for k in ("exposed_share", "hidden_share", "idle_share",
                                                   "step_overhead", "probe_exposed_comm")},
             "ops": ", ".join(f"{op['name']} {op['self_s_per_step'] * 1e3:.1f}" for op in r["top_ops"][:5])}
            for r in trace_rows(loaded)]


def _memory_rows(loaded: Loaded) -> list[dict]:
    """The Memory by category section's rows: MiB, the planner's beside the measured."""
    def mib(value) -> str:
        return _num(value if value is None else value / 2**20, "{:.2f}")

    return [{**r, **{k: mib(r.get(k)) for k in (*COLUMNS, "total", "partitions",
                                                    *(f"planned_{k}" for k in PLANNED))}}
            for r in memory_rows(loaded)]


def _straggler_rows(loaded: Loaded) -> list[dict]:
    """The Stragglers section's rows: every case of two or more ranks, formatted."""
    def times(values: list) -> str:
        return " / ".join(_num(v, "{:.4f}") for v in values)

    return [{**r, "ratio": _num(r["ratio"], "{:.3f}"), "ratio_max": _num(r["ratio_max"], "{:.3f}"),
             "slowest": (f"{r['rank']} ({r['node']}), {r['share']:.0%} of {r['probe_steps']}"
                         if r["rank"] is not None else r["why_empty"] or "-"),
             "probe": times(r["probe_medians"]), "steps": times(r["step_medians"]),
             "flag": Markdown("**straggler**") if r["flagged"] else ""}
            for r in stragglers(loaded)]


def _energy_note(loaded: Loaded, row: dict) -> str:
    """What the case's energy figure is, or why it has none (its latest trial's words)."""
    result = loaded.results[row["run_id"]]
    if result.metrics.get("energy_j") is not None:
        return str(result.metrics.get("energy_basis") or "")
    return result.null_reasons.get("energy_j") or "not recorded (a result from before energy was read)"


def _fmt_scale(scale) -> dict:
    """The Collectives, Projection and Memory-fit sections' rows, formatted."""
    sizes = sorted({n for row in scale.plan for n in row["memory"]})
    return {
        "collectives": [{**r, "size": _num(r["size_bytes"], "{:,}"), **{
            f"{op}_{kind}": _num(r[f"{kind}_{op}"] if kind == "busbw_gbps" else r[f"{kind}_{op}"] and
                                 r[f"{kind}_{op}"] * 1e6, fmt)
            for op in OPS for kind, fmt in (("busbw_gbps", "{:.3g}"), ("latency_s", "{:.0f}"))}}
            for r in scale.collectives],
        "traffic": [{**r, **{f"{op}_mb": _num(r["bytes_by_op"][op] / 1e6 if op in r["bytes_by_op"] else None,
                                              "{:.3g}") for op in OPS},
                     "bus_mb": f"{r['bus_bytes'] / 1e6:.3g}", "vs_ddp": _num(r["vs_ddp"], "{:.2f}x"),
                     "sizes": (f"{r['smallest'] / 1e6:.3g}" if r["smallest"] == r["largest"]
                               else f"{r['smallest'] / 1e6:.3g} - {r['largest'] / 1e6:.3g}")}
                    for r in scale.traffic],
        "nominal": [f"{p}: {', '.join(f'{k} = {v:g} GB/s' for k, v in n.items())}"
                    for p, n in scale.nominal.items() if n],
        "projection": [{**r, **{k: _num(r[k], f) for k, f in (
            ("step_s", "{:.4g}"), ("measured_step_s", "{:.4g}"), ("tokens_per_s", "{:,.0f}"),
            ("weak_efficiency", "{:.2f}"), ("strong_efficiency", "{:.2f}"), ("exposed_comm_share", "{:.1%}"),
            ("usd_per_million_tokens", "{:.4f}"))}} for r in scale.projection],
        "validation": [{**v, "predicted_s": f"{v['predicted_s']:.4g}", "measured_s": f"{v['measured_s']:.4g}",
                        "error": f"{v['error']:+.1%}"} for v in scale.validation],
        "notes": scale.notes, "memory_sizes": sizes, "plan_lines": scale.plan_lines,
        "plan_measured": scale.plan_measured,
        "predicted": [{**p, "predicted_step_s": f"{p['predicted_step_s']:.4g}",
                       "calibrated_step_s": f"{p['calibrated_step_s']:.4g}"} for p in scale.predicted],
        "plan": [{**r, "cells": [f"{r['memory'][n]:.1f}" for n in sizes]} for r in scale.plan],
        "memory_check": [{**c, "error": f"{c['error']:+.1%}"} for c in scale.memory_check],
        "memory_error": (f"{max(abs(c['error']) for c in scale.memory_check):.1%}" if scale.memory_check
                         else None)}


def _latest_ok(loaded: Loaded):
    ok = [r for r in loaded.results.values() if r.ok]
    return max(ok, key=lambda r: r.created_utc) if ok else None


def _environment(loaded: Loaded) -> list[tuple[str, str]]:
    latest = _latest_ok(loaded) or next(iter(loaded.results.values()))
    e = latest.env
    keys = [("device", "device_name"), ("devices", "device_count"), ("CPU", "cpu"), ("host", "host"),
            ("GPU driver", "driver"), ("CUDA", "cuda"), ("NCCL", "nccl"), ("torch", "torch"),
            ("DeepSpeed", "deepspeed"), ("Python", "python"), ("platform", "platform"),
            ("git commit", "git_commit")]
    return [(label, str(e[key])) for label, key in keys if e.get(key) not in (None, "")]


def _strategy_rows(loaded: Loaded) -> list[dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for result in loaded.results.values():
        s, c = result.spec, result.strategy_config
        name = s.run_as
        if not c or name in seen:
            continue
        details = {k: v for k, v in c.items() if k in DETAILS}
        if c.get("activation_checkpointing"):
            details["activation_checkpointing"] = c["activation_checkpointing"]
        ds = c.get("deepspeed_config", {})
        if ds.get("zero_optimization"):
            details["zero_optimization"] = ds["zero_optimization"]
        if ds.get("communication_data_type"):
            details["communication_data_type"] = ds["communication_data_type"]
        work = c.get("workload", {})
        if work.get("lora"):
            details["lora"] = work["lora"]
        if work.get("quantization"):
            details["quantization"] = {k: v for k, v in work["quantization"].items() if k != "layers"}
        seen[name] = {
            "strategy": name, "wrapper": c.get("wrapper", ""),
            "precision": c.get("precision", ""), "sync": c.get("grad_sync_during_accumulation", ""),
            "details": ", ".join(f"{k}={v}" for k, v in details.items()).replace("|", "/")}
    return [seen[k] for k in sorted(seen)]


def _shared_config(loaded: Loaded) -> str:
    result = _latest_ok(loaded)
    if result is None:
        return "no finished case"
    c, s = result.strategy_config, result.spec
    return (f"{c.get('optimizer')}, {c.get('lr_schedule')} lr, grad clip {c.get('grad_clip_max_norm')}, "
            f"grad accum {s.grad_accum}, micro-batch {s.micro_batch}, {s.steps} steps "
            f"({s.warmup_steps} warm-up), model {s.model} ({result.n_params:,} parameters), seed {s.seed}.")


def _baseline_ws(frame: pd.DataFrame) -> str:
    values = sorted({int(v) for v in frame.scaling_baseline_world_size.dropna()})
    return ", ".join(map(str, values)) or "none measured"


def _scaling_tables(frame: pd.DataFrame) -> list[dict]:
    tables = []
    for (profile, seq_len, workload), group in frame.groupby(["profile", "seq_len", "workload"]):
        sizes = sorted(group.world_size.unique())
        rows = []
        for strategy, g in group.groupby("strategy"):
            by_ws = {r.world_size: _with_interval(r.scaling_efficiency, r.case_scaling_efficiency_ci_low,
                                                  r.case_scaling_efficiency_ci_high, "{:.2f}")
                     for r in g.itertuples()}
            rows.append({"strategy": strategy, "cells": [by_ws.get(ws, "-") for ws in sizes]})
        strong = (group.scaling == "strong").any()
        kind = "strong scaling (same global batch)" if strong else "weak scaling (same per-device batch)"
        title = f"{profile}, seq {seq_len}" + ("" if workload == "pretrain" else f", {workload}")
        title += f": {kind}"
        tables.append({"title": title, "world_sizes": sizes, "rows": rows})
    return tables


def _with_interval(value, low, high, fmt: str) -> str:
    """``0.85 (0.78 to 0.91)``: the value and its 95% interval, where there is one."""
    text = _num(value, fmt)
    if text != "-" and _num(low, fmt) != "-":
        text += f" ({fmt.format(low)} to {fmt.format(high)})"
    return text


def _fmt_variant(v: dict) -> dict:
    formats = {"overhead": "{:.1%}", "base_overhead": "{:.1%}", "loss_gap": "{:.1e}",
               "loss_last_delta": "{:+.1e}"}
    return {**v, **{key: _num(v[key], fmt) for key, fmt in formats.items()}}


def _trial_rows(loaded: Loaded) -> list[dict]:
    """Cases with two or more ok trials: each trial's tokens/s, the mean, its interval, the cv,
    and the trials per side that would separate a NEEDED_FOR difference at that cv."""
    rows = []
    for r in loaded.frame[pd.to_numeric(loaded.frame.case_trials_ok) > 1].itertuples():
        cv = r.case_tokens_per_s_cv
        rows.append({"case": f"{r.profile}-{r.case_id}",
                     "trials": f"{r.case_trials_ok} of {r.case_trials}",
                     "per_trial": ", ".join(f"{v:,.0f}" for v in r.trials_tokens_per_s),
                     "mean": _with_interval(r.case_tokens_per_s_mean, r.case_tokens_per_s_ci_low,
                                            r.case_tokens_per_s_ci_high, "{:,.0f}"),
                     "median": _num(r.case_tokens_per_s_median, "{:,.0f}"), "cv": _num(cv, "{:.1%}"),
                     "slot": _num(r.case_mean_slot, "{:.1f}"),
                     "needed": (stats.trials_needed(cv, NEEDED_FOR) if cv else None) or "-"})
    return rows


def _formats() -> dict[str, str]:
    return {m.name: m.fmt for m in metrics.table() if m.fmt} | {"trainable_share": "{:.2%}"}


def _fmt_row(row: dict) -> dict:
    formats = _formats()
    out = {k: (_num(v, formats[k]) if k in formats else v) for k, v in row.items()}
    out["trials"] = f"{row['case_trials_ok']} of {row['case_trials']}"
    out["tokens_per_s"] = _with_interval(row["tokens_per_s"], row["case_tokens_per_s_ci_low"],
                                         row["case_tokens_per_s_ci_high"], formats["tokens_per_s"])
    return out


def _num(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)
