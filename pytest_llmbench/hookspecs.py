"""Hooks that other pytest plugins (or a conftest.py) implement to extend pytest-llmbench."""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_llmbench_launchers(config: pytest.Config) -> list:
    """Return launchers to add (``pytest_llmbench.launchers.LauncherKind`` objects), selectable
    with ``--llmbench-launcher=NAME``. Called before the plugin reads its options; a launcher
    registered here adds its own options in its plugin's ``pytest_addoption``."""


@pytest.hookspec
def pytest_llmbench_metrics(config: pytest.Config) -> list:
    """Return metrics to add (``harness.metrics.Metric`` rows, each with its ``derive(result)``):
    derived from every finished result, stored with it, and read by the report, the gate (when
    higher is better), the winners table and the terminal summary like the built-in ones."""


@pytest.hookspec
def pytest_llmbench_report_sections(config: pytest.Config | None) -> list:
    """Return report sections to add (``pytest_llmbench.report.sections.Section`` objects: a name, a
    function of the report's view that computes and formats the section's variables, its Jinja text
    and the section it goes after). ``llmbench-report`` calls this hook of the conftest.py in the
    folder it runs in with ``config=None``, as pytest-benchmark's command line does."""
