"""Report figures (matplotlib, PNG). One colour per strategy everywhere; integer
world-size ticks; units on every axis. A panel holds one profile (one model on one device)
and one sequence length or world size, so no two series in it share a label and nothing
from another model is drawn beside it; legends sit outside the data (``check_figure`` says
so for any figure, tests/unit/test_plots.py for the committed samples). Where cases ran
several trials, a value is drawn with its trials as small dots and, where it has one, its 95%
interval as an error bar."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.transport import write_atomic  # noqa: E402
from pytest_llmbench.report.load import Loaded  # noqa: E402
from pytest_llmbench.report.plot_style import (  # noqa: E402
    DPI,
    RECORDED,
    _case_labels,
    _int_ticks,
    _legend,
    _panel_title,
    _panels,
    _series,
    color,
    look,
)
from pytest_llmbench.report.plots_scale import _collectives, _per_rank, _projection  # noqa: E402
from pytest_llmbench.report.variants import variant_rows  # noqa: E402


def figures(loaded: Loaded) -> dict[str, tuple[str, plt.Figure]]:
    """{title: (file name, figure)} of every figure (FIGURES, at the end of this module) the data
    supports; figures with no data are left out (the caveats say why), never drawn empty. The
    caller closes them."""
    RECORDED.clear()
    RECORDED.update(loaded.strategy_facts)
    ok = loaded.frame[loaded.frame.status == "ok"].copy()
    out = {}
    # Stored names become titles, labels and legends: text, never matplotlib's mathtext (a profile
    # named "a$\frac{$" made the report raise); each Text keeps the setting it was made with.
    with matplotlib.rc_context({"text.parse_math": False}):
        for title, name, draw in FIGURES:
            fig = draw(ok, loaded)
            if fig is None:
                continue
            fig.suptitle(title)
            fig.tight_layout()
            out[title] = (name, fig)
    return out


def make_plots(loaded: Loaded, out_dir: Path) -> dict[str, str]:
    """Write every figure the data supports; {title: file name}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for title, (name, fig) in figures(loaded).items():
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI)
        write_atomic(out_dir / name, png.getvalue())  # never through a symlink at that path
        plt.close(fig)
        written[title] = name
    return written


def check_figure(fig: plt.Figure) -> list[str]:
    """What makes a figure misread, one line each: two series of a panel under one label, one series
    with two points at one x (two cases joined as one line), a panel whose series come from two
    profiles (each line's gid is its profile), a legend over the panel's data or off the figure, two
    bars or boxes under one tick label."""
    fig.canvas.draw()
    problems, box = [], fig.bbox
    for ax in fig.axes:
        name = ax.get_title() or "panel"
        labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            problems.append(f"{name}: two series labelled {', '.join(twice)}")
        for line in ax.get_lines():
            xs = list(line.get_xdata())
            if not line.get_label().startswith("_") and len(set(xs)) < len(xs):
                problems.append(f"{name}: series {line.get_label()} has two points at one x (two cases "
                                f"drawn as one line)")
        profiles = {line.get_gid() for line in ax.get_lines() if line.get_gid()}
        if len(profiles) > 1:
            problems.append(f"{name}: series of profiles {', '.join(sorted(profiles))} in one panel")
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        # categorical bars under one label are drawn over each other: more bars than ticks
        if ax.patches and (len(ticks) != len(set(ticks)) or len(ax.patches) > len(ticks)):
            problems.append(f"{name}: two bars or boxes under one tick label")
        legend = ax.get_legend()
        if legend is not None:
            extent = legend.get_window_extent()
            if extent.overlaps(ax.get_window_extent()):
                problems.append(f"{name}: the legend lies over the data")
            inside = box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1 and box.y0 - 1 <= extent.y0 \
                and extent.y1 <= box.y1 + 1
            if not inside:
                problems.append(f"{name}: the legend runs off the figure")
    return problems


def _vs_world_size(frame: pd.DataFrame, column: str, ylabel: str, *, ideal: bool = False,
                   linear_at: float | None = None, **ax_settings):
    """``column`` against world size, a line per strategy, a panel per seq len.

    ``ideal``: a dotted ideal-linear line from each strategy's smallest world size;
    ``linear_at``: a dashed horizontal reference line at that value.
    """
    fig, panels = _panels(frame)
    for (profile, seq_len), ax in panels:
        rows = frame[(frame.profile == profile) & (frame.seq_len == seq_len)]
        for label, g in _series(rows):
            g = g.sort_values("world_size")
            shade, line = look(g)
            ax.plot(g.world_size, g[column], line, color=shade, label=label, gid=profile)
            _trial_spread(ax, g.world_size.tolist(), g, column, shade)
            if ideal:
                base = g.iloc[0]
                ax.plot(g.world_size, base[column] * g.world_size / base.world_size, ":",
                        color=shade, alpha=0.6, gid=profile)
        if linear_at is not None:
            ax.axhline(linear_at, color="gray", linestyle="--", label="linear")
        title = _panel_title(profile, rows, f"seq {seq_len}") + (" (dotted: ideal linear)" if ideal else "")
        ax.set(title=title, xlabel="world size (ranks)", ylabel=ylabel, **ax_settings)
        _int_ticks(ax)
        _legend(ax)
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
    ok = ok.sort_values(["profile", "seq_len", "world_size", "strategy"])
    data = [[t for rid in run_ids for t in loaded.results[rid].step_times_s] for run_ids in ok.run_ids]
    labels = _case_labels(ok)
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
    for (profile, ws), ax in panels:
        rows = ok[(ok.profile == profile) & (ok.world_size == ws)]
        for label, g in _series(rows):
            g = g.sort_values("seq_len")
            ax.plot(g.seq_len, g.peak_memory_gib, "o-", color=look(g)[0], label=label, gid=profile)
        ax.set(title=_panel_title(profile, rows, f"world size {ws}"), xlabel="sequence length (tokens)",
               ylabel=f"peak memory (GiB, {rows.peak_memory_kind.iloc[0]})",
               xticks=sorted(rows.seq_len.unique()))
        _legend(ax)
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
    frame = frame.dropna(subset=[metric]).sort_values(["profile", "seq_len", "world_size", "strategy"])
    if frame.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(frame)), 4.2))
    labels = _case_labels(frame)
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
    for (profile, ws), ax in panels:
        mine = ok[(ok.profile == profile) & (ok.world_size == ws)]
        seq = mine.seq_len.min()
        curves = {label: (loaded.results[g.iloc[-1].run_id].losses, color(g.iloc[-1].strategy_name))
                  for label, g in _series(mine[mine.seq_len == seq])}
        for label, (losses, shade) in curves.items():
            ax.plot(range(1, len(losses) + 1), losses, color=shade, label=label, alpha=0.8, gid=profile)
        spread = _spread([losses for losses, _ in curves.values()])
        ax.set(title=_panel_title(profile, mine, f"ws{ws}, seq {seq}: {spread}"), xlabel="step",
               ylabel="training loss (mean over ranks)")
        _legend(ax)
        ax.grid(alpha=0.3)
    return fig


def _spread(curves: list[list[float]]) -> str:
    """How far apart the loss curves are: they should coincide (same seed, same global batch)."""
    steps = min(map(len, curves))
    if len(curves) < 2 or steps == 0:
        return "one strategy"
    gap = max(max(c[i] for c in curves) - min(c[i] for c in curves) for i in range(steps))
    return f"max gap between strategies {gap:.1e}"


FIGURES: list[tuple[str, str, Callable]] = [
    ("Throughput vs world size", "tokens_per_s.png", _throughput),
    ("Step-time distribution per case", "step_times.png", _step_times),
    ("Peak memory vs sequence length", "memory_vs_seq_len.png", _memory_vs_seq),
    ("Peak memory vs world size", "memory_vs_world_size.png", _memory_vs_ws),
    ("Scaling efficiency", "scaling_efficiency.png", _efficiency),
    ("MFU by strategy and world size", "mfu.png", _mfu),
    ("Loss curves", "loss_curves.png", _losses),
    ("Per rank: compute-only step vs the median rank", "per_rank.png", _per_rank),
    ("Cost per 1M tokens", "cost.png", _cost),
    ("Variants: memory saved vs throughput cost", "variants.png", _variants),
    ("Collectives: bus bandwidth vs message size", "collectives.png", _collectives),
    ("Projection: tokens/s vs world size (measured solid, projected dashed)", "projection.png", _projection),
]
