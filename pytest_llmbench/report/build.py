"""build_report: stored results -> OUTPUT/report/{metrics.csv, plots/*.png, REPORT.md, REPORT.html}."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import jinja2

from harness.transport import write_atomic
from pytest_llmbench.profiles import Profile, load_profiles
from pytest_llmbench.report import escape, history, sections
from pytest_llmbench.report.html import render_html
from pytest_llmbench.report.load import Loaded, ReportError, columns, load_results
from pytest_llmbench.report.plots import make_plots
from pytest_llmbench.report.scale import build_scale
from pytest_llmbench.report.sections import ab, measured, scale, summary, tables

TEMPLATES = Path(__file__).resolve().parent / "templates"
# REPORT.md, top to bottom: each section's part (templates/sections/<name>.md.j2) with its own rows
SECTIONS = (*summary.SECTIONS, *tables.SECTIONS, *ab.SECTIONS, *scale.SECTIONS, *measured.SECTIONS[:-2],
            sections.Section("history", history.section), *measured.SECTIONS[-2:])
__all__ = ["ReportError", "build_report"]


def build_report(output: str | Path, *, echo: Callable[[str], None] = print,
                 fail_on_empty: bool = False, sessions: Sequence[str] = (),
                 profiles: dict[str, Profile] | None = None, project: Sequence[int] | None = None,
                 draw: bool = True) -> int:
    """Write the report for every result stored under ``output`` (or only ``sessions``);
    the exit code. No results: a message and exit 0 with nothing written (1 with
    ``fail_on_empty``). A session that is not stored raises ReportError. ``profiles`` (default:
    the built-in ones) give the projection its world sizes, links and device memory; ``project``
    overrides their ``project_world_sizes``. ``draw=False``: no plots (the report says so, and an
    earlier report's are removed, so that none is taken for this one's).
    """
    output = Path(output)
    loaded = load_results(output, sessions)
    if loaded.frame.empty and loaded.skipped_files:  # stored results, none readable: not "no results"
        echo(f"llmbench: none of the stored results under {output / 'results'} can be read "
             f"({len(loaded.skipped_files)} file(s) skipped; first: {loaded.skipped_files[0]}); "
             f"no report written")
        return 1
    if loaded.frame.empty:
        probes = f" (only {len(loaded.probes)} collectives probe(s))" if loaded.probes else ""
        echo(f"llmbench: no stored results under {output / 'results'}; no report written{probes}")
        return 1 if fail_on_empty else 0
    loaded.scale = build_scale(loaded, profiles if profiles is not None else load_profiles([]), project)
    report_dir = output / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    # every file through write_atomic: a symlink planted at its path is replaced, never followed
    cells = loaded.trials[columns()].map(escape.csv_cell)  # stored text a spreadsheet would run
    write_atomic(report_dir / "metrics.csv", cells.to_csv(index=False))
    plots = _draw(loaded, output, report_dir / "plots") if draw else _undrawn(report_dir / "plots")
    markdown = render_markdown(loaded, plots, output)
    write_atomic(report_dir / "REPORT.md", markdown)
    write_atomic(report_dir / "REPORT.html", render_html(markdown, report_dir))
    echo(f"llmbench: report of {len(loaded.frame)} case(s) written to {report_dir / 'REPORT.md'} "
         f"(and REPORT.html)")
    return 0


def _draw(loaded: Loaded, output: Path, folder: Path) -> dict[str, str]:
    return make_plots(loaded, folder) | history.write_figures(output, folder)


def _undrawn(folder: Path) -> None:
    """No figures this time: those of an earlier report removed."""
    for old in folder.glob("*.png") if folder.is_dir() else ():
        old.unlink()  # a symlink at that name: the link, never what it points to
    return None


def render_markdown(loaded: Loaded, plots: dict[str, str] | None, output: Path) -> str:
    """REPORT.md: every section's part rendered with its own variables, in order (plugins' sections
    after the one each names: report/sections)."""
    # every printed string is escaped for markdown unless the report wrote it as Markdown (escape.py)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, finalize=escape.finalize)
    env.filters["code"] = escape.code
    view = sections.View(loaded, plots, output)
    parts = []
    for section in sections.ordered(SECTIONS):
        template = (env.from_string(section.template) if section.template is not None
                    else env.get_template(f"sections/{section.name}.md.j2"))
        parts.append(template.render(**section.variables(view)))
    return "".join(parts)
