"""The report's sections of what each case measured beyond its step: memory by category, cost,
energy, the trace, stragglers; then the figures and the caveats."""

from __future__ import annotations

from pytest_llmbench.report.escape import Markdown
from pytest_llmbench.report.findings import STRAGGLER_RATIO, STRAGGLER_SHARE, caveats, stragglers
from pytest_llmbench.report.load import Loaded
from pytest_llmbench.report.memory import COLUMNS, PLANNED, memory_rows
from pytest_llmbench.report.sections import Section, Variables, View
from pytest_llmbench.report.sections.fmt import num, row
from pytest_llmbench.report.traces import trace_rows

TRACE_MS = ("step_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "measured_step_s")
TRACE_SHARES = ("exposed_share", "hidden_share", "idle_share", "step_overhead", "probe_exposed_comm")


def memory_categories(view: View) -> Variables:
    """The Memory by category rows: MiB, the planner's beside the measured."""
    def mib(value) -> str:
        return num(value if value is None else value / 2**20, "{:.2f}")

    keys = (*COLUMNS, "total", "partitions", *(f"planned_{k}" for k in PLANNED))
    return {"memory_rows": [{**r, **{k: mib(r.get(k)) for k in keys}} for r in memory_rows(view.loaded)]}


def cost(view: View) -> Variables:
    return {"cost_rows": [row(r) for r in _ok_rows(view.loaded)]}


def energy(view: View) -> Variables:
    return {"energy_rows": [row(r) | {"energy_note": energy_note(view.loaded, r)}
                            for r in _ok_rows(view.loaded)]}


def _ok_rows(loaded: Loaded) -> list[dict]:
    frame = loaded.frame
    return frame[frame.status == "ok"].to_dict("records")


def energy_note(loaded: Loaded, values: dict) -> str:
    """What the case's energy figure is, or why it has none (its latest trial's words)."""
    result = loaded.results[values["run_id"]]
    if result.metrics.get("energy_j") is not None:
        return str(result.metrics.get("energy_basis") or "")
    return result.null_reasons.get("energy_j") or "not recorded (a result from before energy was read)"


def trace(view: View) -> Variables:
    """The Trace rows: milliseconds per step and shares, rank 0's top five ops."""
    def ms(value) -> str:
        return num(value if value is None else value * 1e3, "{:.1f}")

    return {"trace_rows": [
        {**r, **{k: ms(r[k]) for k in TRACE_MS}, **{k: num(r[k], "{:.1%}") for k in TRACE_SHARES},
         "ops": ", ".join(f"{op['name']} {op['self_s_per_step'] * 1e3:.1f}" for op in r["top_ops"][:5])}
        for r in trace_rows(view.loaded)]}


def straggler_rows(view: View) -> Variables:
    """Every case of two or more ranks: the ratio, the slowest rank, each rank's medians."""
    def times(values: list) -> str:
        return " / ".join(num(v, "{:.4f}") for v in values)

    rows = [{**r, "ratio": num(r["ratio"], "{:.3f}"), "ratio_max": num(r["ratio_max"], "{:.3f}"),
             "slowest": (f"{r['rank']} ({r['node']}), {r['share']:.0%} of {r['probe_steps']}"
                         if r["rank"] is not None else r["why_empty"] or "-"),
             "probe": times(r["probe_medians"]), "steps": times(r["step_medians"]),
             "flag": Markdown("**straggler**") if r["flagged"] else ""}
            for r in stragglers(view.loaded)]
    return {"straggler_rows": rows, "straggler_ratio": f"{STRAGGLER_RATIO:.2f}",
            "straggler_share": f"{STRAGGLER_SHARE:.0%}"}


SECTIONS = (Section("memory_categories", memory_categories), Section("cost", cost), Section("energy", energy),
            Section("trace", trace), Section("stragglers", straggler_rows),
            Section("figures", lambda view: {"plots": view.plots}),
            Section("caveats", lambda view: {"caveats": caveats(view.loaded)}))
