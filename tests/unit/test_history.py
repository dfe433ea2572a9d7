"""History with change points (report/history.py) through the real library, Apache Otava: 20 stored
sessions of a case whose tokens/s steps down 10% at session 12 (lognormal session noise, cv 3%, seeded)
give one change point, at session 12, naming its session and commit; a flat series gives none; the
plot of the family passes ``plots.check_figure``."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from pytest_llmbench.report import history
from pytest_llmbench.report.plots import check_figure

pytest.importorskip("otava.analysis", reason="apache-otava is installed by make install (--no-deps)")
DATA = Path(__file__).resolve().parent.parent / "data"


def store_of(tmp_path: Path, factors: list[float], seed: int = 7, commit: str = "c" * 38) -> Path:
    """One session per factor: the stored ddp ws2 result with tokens/s x factor x noise."""
    template = json.loads(next((DATA / "store" / "results").glob("*/tinycpu-ddp-ws2-seq64.json")).read_text())
    rng = random.Random(seed)
    for i, factor in enumerate(factors):
        data = json.loads(json.dumps(template))
        data["metrics"]["tokens_per_s"] *= factor * math.exp(rng.gauss(0, 0.03))
        data["env"]["git_commit"] = f"{i + 1:02d}" + commit
        data["run_id"] = f"run{i}"
        folder = tmp_path / "results" / f"20261101T{i:02d}0000Z-aaaa"
        folder.mkdir(parents=True)
        (folder / "tinycpu-ddp-ws2-seq64.json").write_text(json.dumps(data))
    return tmp_path


def test_a_ten_percent_step_at_session_12_is_one_change_point_there(tmp_path):
    out = store_of(tmp_path, [1.0] * 11 + [0.9] * 9)
    (series,) = [s for s in history.collect(out) if s.metric == "tokens_per_s"]
    assert len(series.values) == 20
    (change,) = series.changes
    assert change.index == 11 and change.session == "20261101T110000Z-aaaa"  # the 12th session
    assert change.commit == "12cccccccccc" and change.change == pytest.approx(-0.10, abs=0.03)
    assert change.pvalue < history.MAX_PVALUE
    assert "20261101T110000Z-aaaa (12cccccccccc): -" in "\n".join(history.lines([series]))
    figures = history.figures([series])
    assert list(figures) == ["tinycpu ddp"]
    assert check_figure(figures["tinycpu ddp"]) == []
    plt.close("all")


def test_each_change_is_sized_by_its_adjacent_segments(tmp_path):
    """Two 20% steps: the first was credited with both (mean of all after / all before: -28%)."""
    out = store_of(tmp_path, [1.0] * 10 + [0.8] * 10 + [0.64] * 10)
    (series,) = [s for s in history.collect(out) if s.metric == "tokens_per_s"]
    assert [c.index for c in series.changes] == [10, 20]
    assert [c.change for c in series.changes] == [pytest.approx(-0.20, abs=0.03)] * 2


def test_stored_text_reaches_the_terminal_inert(tmp_path, capsys):
    """A stored commit string with escape sequences (clear the screen, retitle it) and a newline."""
    from pytest_llmbench.report.__main__ import main

    out = store_of(tmp_path, [1.0] * 11 + [0.9] * 9, commit="\x1b[2J\x1b]0;pwned\x07\nfake row")
    assert main([str(out), "--history"]) == 0
    said = capsys.readouterr().out
    assert "\x1b" not in said and "\x07" not in said and "\\x1b[2J" in said
    assert len(said.splitlines()) == 4  # header, two series, the figures line: no row broken in two


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flat_series_has_no_change_point(tmp_path, seed):
    out = store_of(tmp_path, [1.0] * 20, seed=seed)
    assert [s.changes for s in history.collect(out) if s.metric == "tokens_per_s"] == [[]]


def test_too_few_sessions_are_a_series_without_change_points(tmp_path):
    out = store_of(tmp_path, [1.0, 1.0, 0.5])
    (series,) = [s for s in history.collect(out) if s.metric == "tokens_per_s"]
    assert series.changes == [] and "under 5 sessions" in history.lines([series])[1]


def test_llmbench_report_history_prints_the_change_and_writes_the_figure(tmp_path, capsys):
    from pytest_llmbench.report.__main__ import main

    out = store_of(tmp_path, [1.0] * 11 + [0.9] * 9)
    assert main([str(out), "--history"]) == 0
    said = capsys.readouterr().out
    assert "tinycpu-ddp-ws2-seq64" in said and "20261101T110000Z-aaaa (12cccccccccc): -" in said
    assert (out / "report" / "plots" / "history_tinycpu_ddp.png").is_file()


def test_the_report_has_a_history_section_once_a_case_has_five_sessions(tmp_path):
    from pytest_llmbench.report import build_report

    out = store_of(tmp_path, [1.0] * 11 + [0.9] * 9)
    assert build_report(out, echo=lambda _: None) == 0
    report = (out / "report" / "REPORT.md").read_text()
    section = report.split("## History\n")[1].split("\n## ")[0]
    assert "| tinycpu-ddp-ws2-seq64 | tokens_per_s | 20 |" in section
    assert "20261101T110000Z-aaaa (12cccccccccc): -" in section
    assert "plots/history_tinycpu_ddp.png" in report
