"""Report figures (matplotlib, PNG). One colour per strategy everywhere; integer
world-size ticks; units on every axis; one panel per sequence length where it matters.
Where cases ran several trials, a value is drawn with its trials as small dots and, where
it has one, its 95% interval as an error bar."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from harness import strategies  # noqa: E402
from harness.transport import write_atomic  # noqa: E402
from pytest_llmbench.report.load import Loaded  # noqa: E402
from pytest_llmbench.report.variants import variant_rows  # noqa: E402

DPI = 110
MARKERS = {"lora": "^", "qlora": "v"}  # a fine-tuning workload's marker; pretrain: "o" (variant "s")


def color(strategy: str) -> str:
    """A strategy's colour, from its row in the strategy table; its variants and workloads share it."""
    return strategies.get(strategy).color


def style(workload: str, variant: str) -> str:
    """Line style of a strategy as run: a variant dashed, a fine-tuning workload with its own marker."""
    varied = variant != "base"
    return MARKERS.get(workload, "s" if varied else "o") + ("--" if varied else "-")


def look(rows: pd.DataFrame) -> tuple[str, str]:
    """(colour, line style) of rows of one strategy as run (they share strategy, workload, variant)."""
    first = rows.iloc[0]
    return color(first.strategy_name), style(first.workload, first.variant)


def make_plots(loaded: Loaded, out_dir: Path) -> dict[str, str]:
    """Write every figure the data supports; {title: file name}. Figures with no data are
    left out (the caveats say why), never drawn empty."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = loaded.frame[loaded.frame.status == "ok"].copy()
    written: dict[str, str] = {}
    figures: list[tuple[str, str, Callable]] = [
        ("Throughput vs world size", "tokens_per_s.png", _throughput),
        ("Step-time distribution per case", "step_times.png", _step_times),
        ("Peak memory vs sequence length", "memory_vs_seq_len.png", _memory_vs_seq),
        ("Peak memory vs world size", "memory_vs_world_size.png", _memory_vs_ws),
        ("Scaling efficiency", "scaling_efficiency.png", _efficiency),
        ("MFU by strategy and world size", "mfu.png", _mfu),
        ("Loss curves", "loss_curves.png", _losses),
        ("Cost per 1M tokens", "cost.png", _cost),
        ("Variants: memory saved vs throughput cost", "variants.png", _variants),
        ("Collectives: bus bandwidth vs message size", "collectives.png", _collectives),
        ("Projection: tokens/s vs world size (measured solid, projected dashed)", "projection.png",
         _projection),
    ]
    for title, name, draw in figures:
        fig = draw(ok, loaded)
        if fig is None:
            continue
        fig.suptitle(title)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI)
        write_atomic(out_dir / name, png.getvalue())  # never through a symlink at that path
        plt.close(fig)
        written[title] = name
    return written


def _panels(frame: pd.DataFrame, key: str = "seq_len"):
    values = sorted(frame[key].unique())
    fig, axes = plt.subplots(1, len(values), figsize=(5.2 * len(values), 4.2), squeeze=False)
    return fig, list(zip(values, axes[0], strict=True))


def _int_ticks(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _vs_world_size(frame: pd.DataFrame, column: str, ylabel: str, *, ideal: bool = False,
                   linear_at: float | None = None, **ax_settings):
    """``column`` against world size, a line per strategy, a panel per seq len.

    ``ideal``: a dotted ideal-linear line from each strategy's smallest world size;
    ``linear_at``: a dashed horizontal reference line at that value.
    """
    fig, panels = _panels(frame)
    for seq_len, ax in panels:
        for strategy, g in frame[frame.seq_len == seq_len].groupby("strategy"):
            g = g.sort_values("world_size")
            shade, line = look(g)
            ax.plot(g.world_size, g[column], line, color=shade, label=strategy)
            _trial_spread(ax, g.world_size.tolist(), g, column, shade)
            if ideal:
                base = g.iloc[0]
                ax.plot(g.world_size, base[column] * g.world_size / base.world_size, ":",
                        color=shade, alpha=0.6)
        if linear_at is not None:
            ax.axhline(linear_at, color="gray", linestyle="--", label="linear")
        title = f"seq {seq_len}" + (" (dotted: ideal linear)" if ideal else "")
        ax.set(title=title, xlabel="world size (ranks)", ylabel=ylabel, **ax_settings)
        _int_ticks(ax)
        ax.legend()
        ax.grid(alpha=0.3)
    return fig


def _trial_spread(ax, xs: list, rows: pd.DataFrame, column: str, color, scale: float = 1.0) -> None:
    """Each case's trial values as dots and its 95% interval as an error bar, where known."""
    trials, low, high = f"trials_{column}", f"case_{column}_ci_low", f"case_{column}_ci_high"
    for x, (_, row) in zip(xs, rows.iterrows(), strict=True):
        values = row.get(trials)
        if isinstance(values, list) and len(values) > 1:
            ax.plot([x] * len(values), [v * scale for v in values], ".", color=color, alpha=0.5)
        if low in row and pd.notna(row[low]):
            ax.errorbar([x], [row[column] * scale], yerr=[[(row[column] - row[low]) * scale],
                                                          [(row[high] - row[column]) * scale]],
                        color=color, capsize=4, linewidth=1)


def _throughput(ok: pd.DataFrame, _: Loaded):
    if ok.empty:
        return None
    return _vs_world_size(ok, "tokens_per_s", "tokens/s (all ranks)", ideal=True)


def _step_times(ok: pd.DataFrame, loaded: Loaded):
    if ok.empty:
        return None
    ok = ok.sort_values(["seq_len", "world_size", "strategy"])
    data = [[t for rid in run_ids for t in loaded.results[rid].step_times_s] for run_ids in ok.run_ids]
    labels = [f"{r.strategy}\nws{r.world_size} s{r.seq_len}" for r in ok.itertuples()]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(data)), 4.5))
    box = ax.boxplot(data, patch_artist=True, tick_labels=labels)
    for patch, strategy in zip(box["boxes"], ok.strategy_name, strict=True):
        patch.set_facecolor(color(strategy))
    ax.set(ylabel="step time (s), measured steps of all trials, max over ranks")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig


def _memory_vs_seq(ok: pd.DataFrame, _: Loaded):
    if ok.seq_len.nunique() < 2:
        return None
    fig, panels = _panels(ok, "world_size")
    for ws, ax in panels:
        for strategy, g in ok[ok.world_size == ws].groupby("strategy"):
            g = g.sort_values("seq_len")
            ax.plot(g.seq_len, g.peak_memory_gib, "o-", color=look(g)[0], label=strategy)
        ax.set(title=f"world size {ws}", xlabel="sequence length (tokens)",
               ylabel=f"peak memory (GiB, {ok.peak_memory_kind.iloc[0]})",
               xticks=sorted(ok.seq_len.unique()))
        ax.legend()
        ax.grid(alpha=0.3)
    return fig


def _memory_vs_ws(ok: pd.DataFrame, _: Loaded):
    if ok.world_size.nunique() < 2:
        return None
    return _vs_world_size(ok, "peak_memory_gib", "peak memory per rank (GiB)")


def _efficiency(ok: pd.DataFrame, _: Loaded):
    eff = ok.dropna(subset=["scaling_efficiency"])
    if eff.world_size.nunique() < 2:
        return None
    return _vs_world_size(eff, "scaling_efficiency", "weak-scaling efficiency E(N)",
                          linear_at=1.0, ylim=(0, 1.15))


def _bars(frame: pd.DataFrame, metric: str, ylabel: str, scale: float = 1.0):
    frame = frame.dropna(subset=[metric]).sort_values(["seq_len", "world_size", "strategy"])
    if frame.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(frame)), 4.2))
    labels = [f"{r.strategy}\nws{r.world_size} s{r.seq_len}" for r in frame.itertuples()]
    ax.bar(labels, pd.to_numeric(frame[metric]) * scale,
           color=[color(s) for s in frame.strategy_name])
    _trial_spread(ax, list(range(len(frame))), frame, metric, "black", scale)
    ax.set(ylabel=ylabel)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig


def _mfu(ok: pd.DataFrame, _: Loaded):
    return _bars(ok, "mfu", "MFU (% of dense bf16 peak)", scale=100.0)


def _cost(ok: pd.DataFrame, _: Loaded):
    return _bars(ok, "usd_per_million_tokens", "$ per 1M tokens (profile price)")


def _variants(_: pd.DataFrame, loaded: Loaded):
    """One point per variant case: throughput lost (x) against memory saved (y), both vs base."""
    rows = variant_rows(loaded)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for v in rows:
        x, y = 100 * (1 - v["speed"]), 100 * (1 - v["memory"])
        ax.plot(x, y, "o", color=color(v["strategy_name"]))
        ax.annotate(f"{v['strategy']}+{v['variant']} ws{v['world_size']} s{v['seq_len']}", (x, y),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.axvline(0, color="gray", linewidth=0.8)
    ax.set(xlabel="throughput cost vs base (%; < 0: faster)", ylabel="peak memory saved vs base (%)")
    ax.grid(alpha=0.3)
    return fig


def _losses(ok: pd.DataFrame, loaded: Loaded):
    """One curve per strategy (the case's latest trial: with one seed, trials give one curve)."""
    if ok.empty:
        return None
    fig, panels = _panels(ok, "world_size")
    for ws, ax in panels:
        rows = ok[(ok.world_size == ws) & (ok.seq_len == ok.seq_len.min())]
        curves = {row.strategy: loaded.results[row.run_id].losses for row in rows.itertuples()}
        shades = dict(zip(rows.strategy, rows.strategy_name.map(color), strict=True))
        for strategy, losses in curves.items():
            ax.plot(range(1, len(losses) + 1), losses, color=shades[strategy], label=strategy, alpha=0.8)
        ax.set(title=f"ws{ws}, seq {ok.seq_len.min()}: {_spread(list(curves.values()))}", xlabel="step",
               ylabel="training loss (mean over ranks)")
        ax.legend()
        ax.grid(alpha=0.3)
    return fig


def _spread(curves: list[list[float]]) -> str:
    """How far apart the loss curves are: they should coincide (same seed, same global batch)."""
    steps = min(map(len, curves))
    if len(curves) < 2 or steps == 0:
        return "one strategy"
    gap = max(max(c[i] for c in curves) - min(c[i] for c in curves) for i in range(steps))
    return f"max gap between strategies {gap:.1e}"


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
            points = [(row["size_bytes"], row["busbw_gbps"]) for row in r["rows"] if row["op"] == op]
            ax.plot(*zip(*points, strict=True), "o-", ms=3, label=f"{r['profile']} ws{r['world_size']}")
        for profile, nominal in scale.nominal.items():
            for key, value in nominal.items():
                ax.axhline(value, ls=":", color="gray")
                ax.annotate(f"{profile} {key.split('_')[0]}-node, declared", (1, value),
                            xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7,
                            color="gray")
        ax.set(xscale="log", yscale="log", title=op, xlabel="message size (bytes)", ylabel="busbw (GB/s)")
        ax.legend(fontsize=7)
    return fig


def _projection(_: pd.DataFrame, loaded: Loaded):
    """tokens/s vs world size per strategy: measured cases solid with dots, projection dashed."""
    scale = loaded.scale
    rows = scale.projection if scale else []
    if not rows:
        return None
    profiles = sorted({r["profile"] for r in rows})
    fig, axes = plt.subplots(1, len(profiles), figsize=(6 * len(profiles), 4.4), squeeze=False)
    ok = loaded.frame[loaded.frame.status == "ok"]
    for profile, ax in zip(profiles, axes[0], strict=True):
        for name in dict.fromkeys(r["label"] for r in rows if r["profile"] == profile):
            mine = [r for r in rows if r["profile"] == profile and r["label"] == name]
            first = mine[0]
            shade = color(first["strategy_name"])
            ax.plot([r["world_size"] for r in mine], [r["tokens_per_s"] for r in mine], "--",
                    color=shade, alpha=0.8, label=f"{name} projected")
            measured = ok[(ok.profile == profile) & (ok.strategy == first["run_as"])
                          & (ok.seq_len == first["seq_len"])].sort_values("world_size")
            ax.plot(measured.world_size, measured.tokens_per_s, "o-", color=shade, label=f"{name} measured")
        ax.set(xscale="log", yscale="log", title=profile, xlabel="world size (devices)", ylabel="tokens/s")
        ax.legend(fontsize=6)
    return fig
