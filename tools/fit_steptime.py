"""Fit the step-time predictor's global parameters (pytest_llmbench/planner/steptime.py ``FIT``) on the
published rows of tests/data/published_steps.json, and print the validation table for docs/PLAN.md.

    .venv/bin/python tools/fit_steptime.py            # fit, then the table at the fitted values
    .venv/bin/python tools/fit_steptime.py --table    # the table at the shipped FIT only
    .venv/bin/python tools/fit_steptime.py --cross-validate   # a model's rows by a fit without them

The objective is the mean |log(predicted / published)| tokens/s per device over every row: one set of
global values for all rows, none per row. scipy's Nelder-Mead from the shipped values.
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
FREE = ("gemm", "attention", "memory")


def objective(values, rows) -> float:
    if any(v <= 0 for v in values) or any(v > 1.0 for v in values[:3]):
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


def cross_validate(rows) -> None:
    """Leave one model out: fit on the other models' rows, predict the left-out model's rows."""
    errors = []
    for model in sorted({r["model"] for r in rows}):
        held = [r for r in rows if r["model"] == model]
        fit = fitted([r for r in rows if r["model"] != model])
        v = validation.validate(held, fit)
        errors += [abs(r["error"]) for r in v.rows]
        print(
            f"{model}: {len(held)} rows, mean |error| {v.mean_abs_error:.1%}, max {v.max_abs_error:.1%} "
            f"(fit without it: " + ", ".join(f"{k}={getattr(fit, k):.3g}" for k in FREE) + ")"
        )
    print(f"held out, all rows: mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}")


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
    parser.add_argument("--cross-validate", action="store_true", help="leave one model out, fit, predict it")
    args = parser.parse_args()
    rows = json.loads(DATA.read_text())["rows"]
    if args.cross_validate:
        cross_validate(rows)
        return 0
    fit = steptime.FIT
    if not args.table:
        fit = fitted(rows)
        print(
            "fitted: "
            + ", ".join(f"{k}={getattr(fit, k):.4g}" for k in FREE)
            + f" (objective {objective([getattr(fit, k) for k in FREE], rows):.4f})"
        )
    print(table(validation.validate(rows, fit)))
    transfer = json.loads(DATA.read_text())["transfer_rows"]
    print("\nTransfer, never fitted on (another part):\n")
    print(table(validation.validate(transfer, fit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
