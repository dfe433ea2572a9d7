"""History with change points: every stored session, per case and metric, as a series over sessions
and commits, and where it changed (``llmbench-report --history`` and the report's History section).

One point per session that ran the case: the mean of its finished trials (an A/B session's
candidate side; its baseline side is the other side's, not this code's). A series is one case as
run: its profile, case id, the hash of its spec's identity (another step count, preset or micro
batch is another series, not a change of the code) and the hardware it ran on (``hardware``: the
device part, devices per node and nodes, the interpreter's Python and torch, and the runner label of
--llmbench-runner), never the hostname: a Kubernetes pod's or a Slurm node's is new every session, and
a series keyed by it would hold one point. A bisect's step sessions (results stamped ``bisect_step``)
are never history: they test old commits against new ones, out of order. Change points come from
``report/changes.py``: a max-t test over every split point with its null distribution drawn per
length, binary segmentation, Benjamini-Hochberg at 5% across
every series of the history, and no change under 2%. Each change names the range of commits it
lies in, from the last session before it (the last good commit) to the first after (the first bad
one), and its size from its adjacent segments. One trial per commit, nightly: the series has power
where one session alone has none.

Apache Otava (e-divisive means with Hunter's windows, p < 0.001), used here before, listed false
change points that grew with the series' length and, on the same seeded draws at its defaults
(experiments/history-otava/: 100 flat series of 60 sessions at 15% noise, 400 series with a 10% step at
session 12 of 20 at 5% noise), 9 false change points and the step within one session in 77%; this
detector 0 and 88% there (tests/unit/test_history.py holds its bounds on draws of its own).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.result import BenchResult  # noqa: E402
from pytest_llmbench.machine import hardware  # noqa: E402
from pytest_llmbench.report import changes  # noqa: E402
from pytest_llmbench.store import ResultStore  # noqa: E402

METRICS = ("tokens_per_s", "peak_memory_gib")  # the series kept per case
MIN_SESSIONS = 2 * changes.MIN_SEGMENT  # fewer points than this: a series, no change points


@dataclass
class Change:
    index: int  # the first point after the change
    session: str
    commit: str  # the first bad commit: the first session's after the change
    last_good: str  # the last good commit: the last session's before it
    change: float  # relative: after / before - 1, from the adjacent segments
    pvalue: float

    @property
    def range(self) -> str:
        """The commits the change lies in, as git spells a range: ``last_good..first_bad``."""
        return f"{self.last_good}..{self.commit}"


@dataclass
class Series:
    profile: str
    case_id: str
    metric: str
    identity: str = ""  # a short hash of the spec's identity and the hardware
    hardware: str = ""  # what it ran on (``hardware``)
    runner_label: str = ""  # --llmbench-runner, part of ``hardware``
    sessions: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def family(self) -> str:
        """The plot a series goes to: its profile and strategy as run."""
        return f"{self.profile} {self.case_id.split('-ws')[0]}"

    @property
    def label(self) -> str:
        return f"{self.profile}-{self.case_id} @{self.runner} #{self.identity}"

    @property
    def runner(self) -> str:
        """The runner label, else the device part, for the tables (the hash tells the rest apart)."""
        return self.runner_label or self.hardware.split(",")[0][:24] or "?"


def collect(output, metrics: tuple[str, ...] = METRICS) -> list[Series]:
    """Every case's series over the stored sessions (oldest first), change points found."""
    store = ResultStore(output)
    found: dict[tuple[str, ...], Series] = {}
    for session in store.sessions():
        by_case: dict[tuple[str, ...], list[BenchResult]] = {}
        for profile, result in store.load_session(session):
            if result.ok and result.spec.benchmark == "train" and not result.env.get("bisect_step"):
                where = hardware(result.env)
                identity = hashlib.sha256(f"{result.spec.identity()}\n{where}".encode()).hexdigest()[:8]
                key = (profile, result.case_id, identity, where)
                by_case.setdefault(key, []).append(result)
        for (profile, case_id, identity, host), results in by_case.items():
            for metric in metrics:
                values = [v for r in results
                          if isinstance(v := r.metrics.get(metric), (int, float)) and v > 0]
                if not values:
                    continue
                series = found.setdefault((profile, case_id, identity, host, metric),
                                          Series(profile, case_id, metric, identity, host,
                                                 str(results[-1].env.get("runner") or "")))
                series.sessions.append(session)
                series.commits.append(str(results[-1].env.get("git_commit") or "")[:12] or "-")
                series.values.append(statistics.fmean(values))
    every = sorted(found.values(), key=lambda s: (s.profile, s.case_id, s.metric, s.hardware, s.identity))
    for series, points in zip(every, changes.across([[math.log(v) for v in s.values] for s in every]),
                              strict=True):
        series.changes = _changes(series, points)
    return every


def _changes(series: Series, points: list[tuple[int, float]]) -> list[Change]:
    logs = [math.log(v) for v in series.values]
    return [Change(i, series.sessions[i], series.commits[i], series.commits[i - 1],
                   changes.size(logs, points, i), p) for i, p in points]


def printable(text: str) -> str:
    """Stored text as a terminal shows it inertly: a control character (an escape sequence that clears
    or retitles the screen, a newline that breaks the table) written as its escape, ``\\x1b``."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def lines(all_series: list[Series]) -> list[str]:
    """The command line's table: one line per series, then one per change point."""
    out = [f"{'case':<36} {'metric':<16} {'sessions':>8}  change points (first session after, commits "
           f"last good..first bad)"]
    for s in all_series:
        said = "; ".join(f"{c.session} ({c.range}): {c.change:+.1%}, p={c.pvalue:.1g}" for c in s.changes)
        short = len(s.values) < MIN_SESSIONS
        out.append(printable(f"{s.label:<36} {s.metric:<16} {len(s.values):>8}  "
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
                (line,) = ax.plot(xs, s.values, marker="o", label=f"{s.case_id} @{s.runner} #{s.identity}",
                                  gid=s.profile)
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


def write_figures(output, plots_dir) -> dict[str, str]:
    """The History figures of every family with a series of MIN_SESSIONS or more, written; {title: file}."""
    import io

    from harness.transport import write_atomic
    from pytest_llmbench.report.plot_style import DPI

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
    rows = [{"case": s.label, "metric": s.metric, "sessions": len(s.values),
             "first": s.sessions[0], "last": s.sessions[-1],
             "changes": "; ".join(f"{c.session} ({c.range}): {c.change:+.1%}" for c in s.changes) or "none"}
            for s in collect(view.output) if len(s.values) >= MIN_SESSIONS]
    return {"history": rows, "history_note": ""}
