"""How the report's sections print numbers: one format per metric (the metric table's ``fmt``),
"-" for a value that is not there, and a value with its interval."""

from __future__ import annotations

import math

from harness import metrics


def num(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def with_interval(value, low, high, fmt: str) -> str:
    """``0.85 (0.78 to 0.91)``: the value and its 95% interval, where there is one."""
    text = num(value, fmt)
    if text != "-" and num(low, fmt) != "-":
        text += f" ({fmt.format(low)} to {fmt.format(high)})"
    return text


def formats() -> dict[str, str]:
    return {m.name: m.fmt for m in metrics.table() if m.fmt} | {"trainable_share": "{:.2%}"}


def row(values: dict) -> dict:
    """A case's row with every metric in its format, its trials and tokens/s with its interval."""
    fmts = formats()
    out = {k: (num(v, fmts[k]) if k in fmts else v) for k, v in values.items()}
    out["trials"] = f"{values['case_trials_ok']} of {values['case_trials']}"
    out["tokens_per_s"] = with_interval(values["tokens_per_s"], values["case_tokens_per_s_ci_low"],
                                        values["case_tokens_per_s_ci_high"], fmts["tokens_per_s"])
    return out
