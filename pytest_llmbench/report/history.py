"""History with change points: every stored session, per case and metric, as a series over sessions
and commits, and where it changed (``llmbench-report --history`` and the report's History section).

One point per session that ran the case: the mean of its finished trials (an A/B session's
candidate side; its baseline side is the other side's, not this code's). Change points are found by
Apache Otava (``otava.analysis.compute_change_points``: the e-divisive means of Matteson and James,
with Hunter's sliding windows and merge step, Fleming et al. 2023, https://doi.org/10.1145/3578244.3583719),
on the log values, at Otava's default significance (p < 0.001) and window; a change point names the
first session after the change and its commit. One trial per commit, nightly: the series has power
where one session alone has none.

Otava 0.8.0 pins numpy 2.2 and scipy < 1.17 and brings BigQuery, Postgres and Slack clients for its
command line; only ``otava.analysis`` (numpy and scipy) is used here, and ``make install`` installs
it with ``--no-deps`` next to this project's numpy and scipy (tests/unit/test_history.py holds it
to a series with a known step through the real library).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.result import BenchResult  # noqa: E402
from pytest_llmbench.store import ResultStore  # noqa: E402

METRICS = ("tokens_per_s", "peak_memory_gib")  # the series kept per case
MAX_PVALUE = 0.001  # Otava's default significance for a change point
WINDOW = 30  # Otava's default sliding window, in sessions
MIN_SESSIONS = 5  # fewer points than this: a series, no change points


@dataclass
class Change:
    index: int  # the first point after the change
    session: str
    commit: str
    change: float  # relative: after / before - 1
    pvalue: float


@dataclass
class Series:
    profile: str
    case_id: str
    metric: str
    sessions: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def family(self) -> str:
        """The plot a series goes to: its profile and strategy as run."""
        return f"{self.profile} {self.case_id.split('-ws')[0]}"


def collect(output, metrics: tuple[str, ...] = METRICS) -> list[Series]:
    """Every case's series over the stored sessions (oldest first), change points found."""
    store = ResultStore(output)
    found: dict[tuple[str, str, str], Series] = {}
    for session in store.sessions():
        by_case: dict[tuple[str, str], list[BenchResult]] = {}
        for profile, result in store.load_session(session):
            if result.ok and result.spec.benchmark == "train":
                by_case.setdefault((profile, result.case_id), []).append(result)
        for (profile, case_id), results in by_case.items():
            for metric in metrics:
                values = [v for r in results
                          if isinstance(v := r.metrics.get(metric), (int, float)) and v > 0]
                if not values:
                    continue
                series = found.setdefault((profile, case_id, metric), Series(profile, case_id, metric))
                series.sessions.append(session)
                series.commits.append(str(results[-1].env.get("git_commit") or "")[:12] or "-")
                series.values.append(statistics.fmean(values))
    for series in found.values():
        series.changes = change_points(series)
    return sorted(found.values(), key=lambda s: (s.profile, s.case_id, s.metric))


def change_points(series: Series) -> list[Change]:
    """Otava's change points of the series' log values; [] below MIN_SESSIONS points."""
    if len(series.values) < MIN_SESSIONS:
        return []
    from otava.analysis import compute_change_points

    points, _ = compute_change_points([math.log(v) for v in series.values], window_len=WINDOW,
                                      max_pvalue=MAX_PVALUE)
    out = []
    # each change's size from its adjacent segments only: with a later change point, the whole rest of
    # the series credited this one with that step too (a -0.1% point reported as -18.1%)
    bounds = [0, *(int(p.index) for p in points), len(series.values)]
    for k, point in enumerate(points, 1):
        i = bounds[k]
        before, after = series.values[bounds[k - 1]:i], series.values[i:bounds[k + 1]]
        out.append(Change(i, series.sessions[i], series.commits[i],
                          statistics.fmean(after) / statistics.fmean(before) - 1, float(point.stats.pvalue)))
    return out


def printable(text: str) -> str:
    """Stored text as a terminal shows it inertly: a control character (an escape sequence that clears
    or retitles the screen, a newline that breaks the table) written as its escape, ``\\x1b``."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def lines(all_series: list[Series]) -> list[str]:
    """The command line's table: one line per series, then one per change point."""
    out = [f"{'case':<36} {'metric':<16} {'sessions':>8}  change points (first session after, commit)"]
    for s in all_series:
        said = "; ".join(f"{c.session} ({c.commit}): {c.change:+.1%}, p={c.pvalue:.1g}" for c in s.changes)
        short = len(s.values) < MIN_SESSIONS
        out.append(printable(f"{s.profile + '-' + s.case_id:<36} {s.metric:<16} {len(s.values):>8}  "
                             f"{said or (f'under {MIN_SESSIONS} sessions' if short else 'none')}"))
    return out


def figures(all_series: list[Series], metric: str = "tokens_per_s") -> dict[str, plt.Figure]:
    """{family: figure}: each case of a family (profile and strategy) one line over the sessions it
    ran in, change points marked by a vertical line at the first session after."""
    families: dict[str, list[Series]] = {}
    for s in all_series:
        if s.metric == metric and len(s.values) >= 2:
            families.setdefault(s.family, []).append(s)
    out = {}
    with matplotlib.rc_context({"text.parse_math": False}):
        for family, members in families.items():
            sessions = sorted({x for s in members for x in s.sessions})
            fig, ax = plt.subplots(figsize=(8, 4))
            for s in members:
                xs = [sessions.index(x) + 1 for x in s.sessions]
                (line,) = ax.plot(xs, s.values, marker="o", label=s.case_id, gid=s.profile)
                for c in s.changes:
                    ax.axvline(sessions.index(c.session) + 0.5, color=line.get_color(), linestyle="--",
                               label="_change")
            ax.set_xlabel("stored session (oldest first)")
            ax.set_ylabel(f"{metric} (session mean)")
            ax.set_title(family)
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
            fig.tight_layout()
            out[family] = fig
    return out


def available() -> str | None:
    """Why change points cannot be found here (Otava not installed), or None."""
    try:
        import otava.analysis  # noqa: F401
    except ImportError as exc:
        return f"apache-otava is not installed ({exc}); make install installs it"
    return None


def write_figures(output, plots_dir) -> dict[str, str]:
    """The History figures of every family with a series of MIN_SESSIONS or more, written; {title: file}."""
    from harness.transport import write_atomic
    from pytest_llmbench.report.plot_style import DPI

    if available():
        return {}
    import io

    written = {}
    kept = [s for s in collect(output) if len(s.values) >= MIN_SESSIONS]
    for family, fig in figures(kept).items():
        name = "history_" + "".join(c if c.isalnum() else "_" for c in family) + ".png"
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI)
        plt.close(fig)
        write_atomic(plots_dir / name, png.getvalue())
        written[f"History of tokens/s: {family}"] = name
    return written


def section(view) -> dict:
    """The report's History rows: each series of MIN_SESSIONS sessions or more, its change points."""
    why = available()
    if why:
        return {"history": [], "history_note": why}
    rows = [{"case": f"{s.profile}-{s.case_id}", "metric": s.metric, "sessions": len(s.values),
             "first": s.sessions[0], "last": s.sessions[-1],
             "changes": "; ".join(f"{c.session} ({c.commit}): {c.change:+.1%}" for c in s.changes) or "none"}
            for s in collect(view.output) if len(s.values) >= MIN_SESSIONS]
    return {"history": rows, "history_note": ""}
