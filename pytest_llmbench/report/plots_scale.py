"""The report's figures of scale: the collectives probe's bus bandwidth, the projection, and each rank's
compute-only step beside the median rank (stragglers). Each takes the frame and the loaded results and
returns a figure, or None where the data does not support it (report/plots.py lists them: FIGURES)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pytest_llmbench.report.findings import STRAGGLER_RATIO, stragglers  # noqa: E402
from pytest_llmbench.report.load import Loaded  # noqa: E402
from pytest_llmbench.report.plot_style import _case_labels, _legend, _panels, color  # noqa: E402


def _collectives(_: pd.DataFrame, loaded: Loaded):
    """busbw vs message size, one panel per collective, a line per profile and world size; the
    profile's declared link figure as a dotted reference line."""
    scale = loaded.scale
    rows = [r for r in (scale.collectives if scale else []) if r["status"] == "ok"]
    if not rows:
        return None
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    fig, axes = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 3.8), squeeze=False)
    for op, ax in zip(ops, axes[0], strict=True):
        for r in rows:
            # results stored before the sweep skipped rounded repeats hold a size twice: the last
            by_size = {row["size_bytes"]: row["busbw_gbps"] for row in r["rows"] if row["op"] == op}
            points = sorted(by_size.items())
            ax.plot(*zip(*points, strict=True), "o-", ms=3, label=f"{r['profile']} ws{r['world_size']}")
        for profile, nominal in scale.nominal.items():
            for key, value in nominal.items():
                ax.axhline(value, ls=":", color="gray")
                ax.annotate(f"{profile} {key.split('_')[0]}-node, declared", (1, value),
                            xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7,
                            color="gray")
        ax.set(xscale="log", yscale="log", title=op, xlabel="message size (bytes)", ylabel="busbw (GB/s)")
    _legend(axes[0][-1])  # the same series in every panel: one legend, beside the last
    return fig


def _projection(_: pd.DataFrame, loaded: Loaded):
    """tokens/s vs world size per strategy: measured cases solid with dots, projection dashed."""
    scale = loaded.scale
    rows = scale.projection if scale else []
    if not rows:
        return None
    ok = loaded.frame[loaded.frame.status == "ok"]
    fig, panels = _panels(pd.DataFrame(rows)[["profile", "seq_len"]])
    for (profile, seq_len), ax in panels:
        mine_rows = [r for r in rows if r["profile"] == profile and r["seq_len"] == seq_len]
        for name in dict.fromkeys(r["label"] for r in mine_rows):
            mine = [r for r in mine_rows if r["label"] == name]
            first = mine[0]
            shade = color(first["strategy_name"])
            ax.plot([r["world_size"] for r in mine], [r["tokens_per_s"] for r in mine], "--",
                    color=shade, alpha=0.8, label=f"{name} projected", gid=profile)
            measured = ok[(ok.profile == profile) & (ok.strategy == first["run_as"])
                          & (ok.seq_len == seq_len)].sort_values("world_size")
            ax.plot(measured.world_size, measured.tokens_per_s, "o-", color=shade, label=f"{name} measured",
                    gid=profile)
        ax.set(xscale="log", yscale="log", title=f"{profile}, seq {seq_len}", xlabel="world size (devices)",
               ylabel="tokens/s")
        _legend(ax)
    return fig


def _per_rank(_: pd.DataFrame, loaded: Loaded):
    """Each rank's median compute-only step over the median rank's, per case of two or more ranks;
    the slowest rank ringed and named. The line at 1 is the median rank."""
    rows = [r for r in stragglers(loaded) if r["ratio"] is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(rows)), 4.2))
    for x, r in enumerate(rows):
        medians = r["probe_medians"]
        middle = float(pd.Series(medians).median())
        ys = [m / middle for m in medians]
        ax.scatter([x] * len(ys), ys, s=18, color=color(r["strategy_name"]), zorder=3)
        ax.scatter([x], [ys[r["rank"]]], s=90, facecolors="none", edgecolors="red", zorder=4)
        ax.annotate(f"rank {r['rank']}", (x, ys[r["rank"]]), textcoords="offset points", xytext=(6, 0),
                    fontsize=7, va="center")
    ax.set_xticks(range(len(rows)), _case_labels(pd.DataFrame(rows)))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(STRAGGLER_RATIO, color="red", lw=0.8, ls=":")
    ax.annotate(f"straggler mark {STRAGGLER_RATIO:.2f}", (0, STRAGGLER_RATIO),
                xycoords=("axes fraction", "data"), textcoords="offset points", xytext=(4, 3), fontsize=7,
                color="red")
    ax.set(ylabel="median compute-only step\n/ median rank's", xlim=(-0.5, len(rows) - 0.5))
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig


# (title, file name, draw): the report's figures in its order
