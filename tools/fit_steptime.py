"""Fit the step-time predictor's global parameters (pytest_llmbench/planner/steptime.py ``FIT``) on the
published rows of tests/data/published_steps.json (two GPU generations), and print the validation
tables for docs/PLAN.md: every row, and the summary by device and by source; then the compiled rows, held
out of the fit, predicted at the same values.

    .venv/bin/python tools/fit_steptime.py            # fit, then the tables at the fitted values
    .venv/bin/python tools/fit_steptime.py --table    # the tables at the shipped FIT only
    .venv/bin/python tools/fit_steptime.py --cross-validate [source|codebase|fabric]
                                          # each group's rows by a fit without it, from a neutral start
    .venv/bin/python tools/fit_steptime.py --bootstrap 40   # each fitted value's interval
    .venv/bin/python tools/fit_steptime.py --without overlap  # that value 0, the others fitted (ablation)
    .venv/bin/python tools/fit_steptime.py --leave-out  # writes pytest_llmbench/planner/leaveout.py

The objective is the mean |log(predicted / published)| tokens/s per device over every row: one set of
global values for all rows, none per row, per model or per device. scipy's Nelder-Mead from the shipped
values. ``launch_us`` is not among them (it trades against ``memory``: see steptime.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_llmbench.planner import steptime, validation  # noqa: E402

DATA = ROOT / "tests" / "data" / "published_steps.json"
FITTED = ("gemm", "attention", "memory")
FREE = FITTED  # what the fit moves (--without holds one of them at 0)


def objective(values, rows) -> float:
    if any(v < 0 for v in values) or any(v > 1.0 for v in values):
        return 10.0
    fit = replace(steptime.FIT, **dict(zip(FREE, values, strict=True)))
    return sum(
        abs(math.log(validation.predict_row(r, fit).tokens_per_s_per_device / r["tokens_per_s_per_device"]))
        for r in rows
    ) / len(rows)


def fitted(rows) -> steptime.Fit:
    from scipy.optimize import minimize

    start = [getattr(steptime.FIT, k) for k in FREE]
    best = minimize(
        objective,
        start,
        args=(rows,),
        method="Nelder-Mead",
        options={"xatol": 1e-3, "fatol": 1e-5, "maxiter": 2000},
    )
    return replace(steptime.FIT, **dict(zip(FREE, best.x, strict=True)))


CODEBASE = {"llm-foundry-a100": "llm-foundry"}  # a source whose codebase is another source's; else its own


def fold(row: dict, by: str) -> str:
    """The group a row is left out with: its source, its codebase (the trainer that ran it, on whatever
    part), or its fabric regime (the per-node bandwidth between nodes)."""
    if by == "codebase":
        return CODEBASE.get(row["source"], row["source"])
    if by == "fabric":
        return f"{row.get('inter_node_gbps')} Gb/s a node"
    return row["source"]


def refitted(rows) -> steptime.Fit:
    """Every value refitted from NEUTRAL, not from the all-rows optimum."""
    saved = steptime.FIT
    steptime.FIT = replace(steptime.FIT, **NEUTRAL)
    try:
        return fitted(rows)
    finally:
        steptime.FIT = saved


def cross_validate(rows, by: str = "source") -> None:
    """Leave one group out (``by``: source, codebase or fabric regime): refit from NEUTRAL on the other
    groups' rows, predict the left-out rows, and print the table of docs/PLAN.md."""
    lines = [f"| left out ({by}) | rows | device | fit without it | mean abs error | max abs error "
             "| MFU rank correlation |", "| --- " * 7 + "|"]
    for group in sorted({fold(r, by) for r in rows}):
        held = [r for r in rows if fold(r, by) == group]
        rest = [r for r in rows if fold(r, by) != group]
        if len(rest) < 2 * len(FREE):
            lines.append(f"| {group} | {len(held)} | - | {len(rest)} rows left: too few to fit {len(FREE)} "
                         "values | - | - | - |")
            continue
        fit = refitted(rest)
        values = ", ".join(f"{k} {getattr(fit, k):.3g}" for k in FREE)
        for device in sorted({r["device"] for r in held}):
            v = validation.validate([r for r in held if r["device"] == device], fit)
            lines.append(f"| {group} | {len(v.rows)} | {device} | {values} | {v.mean_abs_error:.1%} | "
                         f"{v.max_abs_error:.1%} | {v.mfu_rank_correlation:.2f} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


def bootstrap(rows, draws: int, seed: int = 0) -> None:
    """Each fitted value's 95% interval over ``draws`` refits on rows resampled with replacement."""
    import random

    rng = random.Random(seed)
    values = {k: [] for k in FREE}
    for i in range(draws):
        fit = fitted([rng.choice(rows) for _ in rows])
        for k in FREE:
            values[k].append(getattr(fit, k))
        print(f"draw {i + 1}: " + ", ".join(f"{k} {getattr(fit, k):.4f}" for k in FREE), flush=True)
    for k, got in values.items():
        got.sort()
        low, high = got[int(0.025 * (len(got) - 1))], got[int(round(0.975 * (len(got) - 1)))]
        print(f"{k}: {getattr(steptime.FIT, k):.3f} (95% of {draws} bootstrap refits: {low:.3f}-{high:.3f})")


NEUTRAL = {"gemm": 0.8, "attention": 0.5, "memory": 0.5}  # a refit's start, not the optimum
LEVEL = 0.98  # the residuals' 1st-99th percentiles: on the leave-out they hold 80% of rows or more
MIN_ROWS = 10  # residuals of the answer's own part when it has this many, else every part's


def leave_out(rows) -> None:
    """Each source left out in turn, every value refitted from NEUTRAL on the other sources' rows, its rows
    predicted: their log(published / predicted) residuals, the interval --time states from them
    (pytest_llmbench/planner/interval.py) and its coverage, each row judged by an interval built without
    its own source's residuals; written to pytest_llmbench/planner/leaveout.py."""
    import datetime
    import statistics

    from pytest_llmbench.planner import interval

    residuals = []
    for source in sorted({r["source"] for r in rows}):
        fit = refitted([r for r in rows if r["source"] != source])
        for r in (r for r in rows if r["source"] == source):
            predicted = validation.predict_row(r, fit).tokens_per_s_per_device
            residuals.append((source, r["device"], r["strategy"],
                              round(math.log(r["tokens_per_s_per_device"] / predicted), 5)))
        print(f"left out {source}: " + ", ".join(f"{k} {getattr(fit, k):.3g}" for k in FREE), flush=True)
    covered = []
    for source, device, _, value in residuals:
        others = tuple(x for x in residuals if x[0] != source)
        low, high = interval.bounds(others, device, LEVEL, MIN_ROWS)
        covered.append(low <= value <= high)
    coverage = statistics.fmean(covered)
    lines = [
        '"""The step-time predictor\'s leave-one-source-out residuals: each published row of',
        "tests/data/published_steps.json predicted by a fit that never saw its source (every value refitted",
        "from a neutral start), as log(published / predicted). --time's interval comes from them",
        "(planner/interval.py). Generated by `tools/fit_steptime.py --leave-out` on "
        f"{datetime.date.today().isoformat()}; do not edit.",
        '"""',
        "",
        "# (source, device, strategy, log(published / predicted))",
        "RESIDUALS = (",
        *(f"    {x!r}," for x in residuals),
        ")",
        f"LEVEL, MIN_ROWS = {LEVEL}, {MIN_ROWS}",
        "# the share of rows inside an interval built without their own source's residuals",
        f"COVERAGE = {coverage:.3f}",
        "",
    ]
    (ROOT / "pytest_llmbench" / "planner" / "leaveout.py").write_text("\n".join(lines))
    print(f"{len(residuals)} residuals; the {(1 - LEVEL) / 2:.1%}-{(1 + LEVEL) / 2:.1%} quantiles covered "
          f"{coverage:.1%} of the rows, each judged without its own source")


def summary(v: validation.Validation) -> str:
    """Mean and max |error| and MFU rank correlation by device and by source."""
    lines = ["| rows of | rows | mean abs error | max abs error | MFU rank correlation |", "| --- " * 5 + "|"]
    for key in ("device", "source"):
        for value in sorted({r[key] for r in v.rows}):
            sub = validation.summarise([r for r in v.rows if r[key] == value])
            lines.append(f"| {key} {value} | {len(sub.rows)} | {sub.mean_abs_error:.1%} | "
                         f"{sub.max_abs_error:.1%} | {sub.mfu_rank_correlation:.2f} |")
    return "\n".join(lines)


def table(v: validation.Validation) -> str:
    lines = [
        "| source | model | N | seq | micro-batch x accum | recompute | published tok/s/GPU | predicted "
        "| error "
        "| MFU published | MFU predicted |",
        "| --- " * 11 + "|",
    ]
    for r in v.rows:
        lines.append(
            f"| {r['source']} | {r['model']} | {r['world_size']} | {r['seq_len']} | {r['micro_batch']} x "
            f"{r['grad_accum']} | {r['recompute']} | {r['tokens_per_s_per_device']:,.0f} | "
            f"{r['predicted']:,.0f} | {r['error']:+.1%} | {r['published_mfu']:.1%} | "
            f"{r['predicted_mfu']:.1%} |"
        )
    lines.append(
        f"\nmean |error| {v.mean_abs_error:.1%}, max |error| {v.max_abs_error:.1%}, "
        f"Spearman's rank correlation of predicted with published MFU {v.mfu_rank_correlation:.2f} "
        f"({len(v.rows)} rows)"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", action="store_true", help="no fit: the table at the shipped FIT")
    parser.add_argument("--cross-validate", nargs="?", const="source",
                        choices=("source", "codebase", "fabric"),
                        help="leave one group out (default: source), refit from a neutral start, predict it")
    parser.add_argument("--bootstrap", type=int, metavar="DRAWS", help="each value's interval over refits "
                        "on resampled rows")
    parser.add_argument("--without", choices=FITTED, help="hold this value at 0 and fit the others")
    parser.add_argument("--leave-out", action="store_true",
                        help="leave-one-source-out residuals from a neutral start: planner/leaveout.py")
    args = parser.parse_args()
    if args.without:
        global FREE
        steptime.FIT = replace(steptime.FIT, **{args.without: 0.0})
        FREE = tuple(k for k in FITTED if k != args.without)
    rows = json.loads(DATA.read_text())["rows"]
    if args.cross_validate:
        cross_validate(rows, args.cross_validate)
        return 0
    if args.bootstrap:
        bootstrap(rows, args.bootstrap)
        return 0
    if args.leave_out:
        leave_out(rows)
        return 0
    fit = steptime.FIT
    if not args.table:
        fit = fitted(rows)
        print(
            "fitted: "
            + ", ".join(f"{k}={getattr(fit, k):.4g}" for k in FREE)
            + f" (objective {objective([getattr(fit, k) for k in FREE], rows):.4f})"
        )
    v = validation.validate(rows, fit)
    print(table(v))
    print()
    print(summary(v))
    held = json.loads(DATA.read_text())["compiled_rows"]
    print("\nHeld out, never fitted on: the published compiled runs (compiled_rows), predicted compiled")
    print(table(validation.validate(held, fit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
