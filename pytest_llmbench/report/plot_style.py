"""How the report's figures look: one colour per strategy (its row's, else as its session recorded it),
a line style per variant and workload, panels per profile and sequence length, legends outside the data,
integer world-size ticks. Shared by report/plots.py and report/plots_scale.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from harness import strategies  # noqa: E402

# The strategy facts the reported sessions recorded (report/load.py fills it as it reads them).
RECORDED: dict[str, dict[str, str]] = {}
DPI = 110
MARKERS = {"lora": "^", "qlora": "v"}  # a fine-tuning workload's marker; pretrain: "o" (variant "s")


UNKNOWN_COLOR = "#7f7f7f"  # a stored strategy neither this process's table nor its session knows


def color(strategy: str) -> str:
    """A strategy's colour, from its row in the strategy table, else as its session recorded it (a
    plugin's, the plugin absent here: store.strategy_facts); its variants and workloads share it."""
    row = strategies.find(strategy)
    if row is not None:
        return row.color
    return RECORDED.get(strategy, {}).get("color", UNKNOWN_COLOR)


def style(workload: str, variant: str) -> str:
    """Line style of a strategy as run: a variant dashed, a fine-tuning workload with its own marker."""
    varied = variant != "base"
    return MARKERS.get(workload, "s" if varied else "o") + ("--" if varied else "-")


def look(rows: pd.DataFrame) -> tuple[str, str]:
    """(colour, line style) of rows of one strategy as run (they share strategy, workload, variant)."""
    first = rows.iloc[0]
    return color(first.strategy_name), style(first.workload, first.variant)


def _panels(frame: pd.DataFrame, key: str = "seq_len"):
    """A panel per (profile, ``key`` value), at most three to a row: [((profile, value), ax)]."""
    values = sorted(frame[["profile", key]].drop_duplicates().itertuples(index=False, name=None))
    cols = min(3, len(values))
    rows = -(-len(values) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(values):]:
        ax.remove()
    return fig, list(zip(values, flat, strict=False))


def _series(rows: pd.DataFrame):
    """A panel's series: (label, rows) per strategy as run and device (named when the panel has two)."""
    devices = rows.device_key.nunique() > 1
    for (strategy, device), g in rows.groupby(["strategy", "device_key"]):
        yield (f"{strategy} on {device}" if devices else strategy), g


def _legend(ax) -> None:
    """The legend beside the panel, never over its data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, frameon=False)


def _panel_title(profile: str, rows: pd.DataFrame, what: str) -> str:
    return f"{profile} ({rows.model.iloc[0]}), {what}"


def _int_ticks(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _case_labels(frame: pd.DataFrame) -> list[str]:
    """A tick label per case: strategy, world size, seq len, and its profile and device where the
    figure holds several (the same strategy of two models must not share a label)."""
    profiles, devices = frame.profile.nunique() > 1, frame.device_key.nunique() > 1
    return [(f"{r.profile}\n" if profiles else "") + f"{r.strategy}\nws{r.world_size} s{r.seq_len}"
            + (f"\n{r.device_key}" if devices else "") for r in frame.itertuples()]
