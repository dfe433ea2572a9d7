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
from matplotlib.ticker import MaxNLocator  # noqa: E402

from harness import strategies  # noqa: E402
from harness.transport import write_atomic  # noqa: E402
from pytest_llmbench.report.findings import STRAGGLER_RATIO, stragglers  # noqa: E402
from pytest_llmbench.report.load import Loaded  # noqa: E402
from pytest_llmbench.report.variants import variant_rows  # noqa: E402

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


def _case_labels(frame: pd.DataFrame) -> list[str]:
    """A tick label per case: strategy, world size, seq len, and its profile and device where the
    figure holds several (the same strategy of two models must not share a label)."""
    profiles, devices = frame.profile.nunique() > 1, frame.device_key.nunique() > 1
    return [(f"{r.profile}\n" if profiles else "") + f"{r.strategy}\nws{r.world_size} s{r.seq_len}"
            + (f"\n{r.device_key}" if devices else "") for r in frame.itertuples()]


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
