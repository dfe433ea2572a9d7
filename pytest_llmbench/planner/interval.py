"""The interval on every step-time answer (``--time``): how far such answers have been off, read from the
predictor's leave-one-source-out residuals on published runs (planner/leaveout.py, written by
``tools/fit_steptime.py --leave-out``): the (1 - level)/2 and (1 + level)/2 quantiles of
log(published / predicted) over the rows of the answer's own part when it has MIN_ROWS of them, else
over every row, applied to the answer. Its coverage is stated as measured on the leave-out (each row
judged by an interval built without its own source). It says how wrong the model has been on runs like
the published ones (FSDP on H100 and A100, 400-3200 Gb/s); a part or fabric far from them can be off by
more, and the interval says which rows it rests on.
"""

from __future__ import annotations

import math
import statistics


def bounds(residuals, device: str, level: float, min_rows: int) -> tuple[float, float]:
    """(low, high) log-residual quantiles for ``device`` (module docstring)."""
    own = [x[3] for x in residuals if x[1] == device]
    values = own if len(own) >= min_rows else [x[3] for x in residuals]
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    lo, hi = round((1 - level) / 2 * 1000) - 1, round((1 + level) / 2 * 1000) - 1
    return cuts[lo], cuts[hi]


def of(tokens_per_s: float, device: str) -> dict:
    """The interval on one answer of tokens/s per device, with what it rests on."""
    from pytest_llmbench.planner import leaveout

    low, high = bounds(leaveout.RESIDUALS, device, leaveout.LEVEL, leaveout.MIN_ROWS)
    own = sum(1 for x in leaveout.RESIDUALS if x[1] == device)
    rows = own if own >= leaveout.MIN_ROWS else len(leaveout.RESIDUALS)
    said = (f"the {rows} published rows on this part" if own >= leaveout.MIN_ROWS
            else f"all {rows} published rows (fewer than {leaveout.MIN_ROWS} on this part)")
    return {"low": tokens_per_s * math.exp(low), "high": tokens_per_s * math.exp(high),
            "level": leaveout.LEVEL, "coverage_on_leave_out": leaveout.COVERAGE, "rows": rows,
            "from": f"leave-one-source-out residuals of {said}"}
