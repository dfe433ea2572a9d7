"""Every committed sample (reports/*/) re-renders from its stored results as it was committed:
metrics.csv equal as a frame, REPORT.md equal line for line. What may differ, and only that: the
"Generated" time, and ``[``/``]`` in stored text, which the report escapes since the samples were
built (report/escape.py: a bracket could start a link)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from pytest_llmbench.report import build_report

REPORTS = Path(__file__).resolve().parents[2] / "reports"
SAMPLES = sorted(p.name for p in REPORTS.iterdir() if (p / "results").is_dir())
# a sample whose report/ was built from some of its sessions (reports/README.md says which)
SESSIONS = {"cpu-gate-sample": ["20261124T102852Z-87c1"]}


def as_committed(markdown: str) -> list[str]:
    """REPORT.md's lines less the time it was generated, brackets unescaped."""
    return [line.replace("\\[", "[").replace("\\]", "]") for line in markdown.splitlines()
            if not line.startswith("Generated ")]


def test_every_sample_with_results_is_checked():
    assert len(SAMPLES) >= 7 and "cpu-sample" in SAMPLES


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_committed_sample_re_renders_equal(sample, tmp_path):
    shutil.copytree(REPORTS / sample / "results", tmp_path / "results")
    assert build_report(tmp_path, echo=lambda _: None, sessions=SESSIONS.get(sample, ())) == 0
    committed, rebuilt = REPORTS / sample / "report", tmp_path / "report"
    pd.testing.assert_frame_equal(pd.read_csv(rebuilt / "metrics.csv"),
                                  pd.read_csv(committed / "metrics.csv"))
    assert (as_committed((rebuilt / "REPORT.md").read_text())
            == as_committed((committed / "REPORT.md").read_text()))
