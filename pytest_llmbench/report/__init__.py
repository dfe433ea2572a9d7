"""The report: stored results -> OUTPUT/report/{metrics.csv, plots/*.png, REPORT.md, REPORT.html}.

Used by ``pytest --llmbench-report``, at the end of a session that ran cases, and by the
``llmbench-report`` console script. Reads JSON only; never runs a benchmark.
"""

from __future__ import annotations

# The report's libraries (pandas, matplotlib, scipy, jinja2) load when a report is built, not when
# the pytest plugin loads: the plugin is imported by every pytest run of an environment that has it.
# ``from pytest_llmbench.report import build_report`` still works (PEP 562's module __getattr__).
_BUILD = ("build_report", "render_markdown", "load_results", "ReportError", "SECTIONS")


def __getattr__(name: str):
    if name in _BUILD:
        from pytest_llmbench.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ReportError", "build_report"]
