"""Stored results outlive plugins (issue 41): a result of a plugin's strategy is read without the plugin
(its strategy stays a name), reported as measured and drawn in the colour its session recorded, and
neither projected nor planned with another strategy's numbers; a plugin metric's column stays in
metrics.csv, from the session's record or from the project's conftest.py (llmbench-report dispatches its
hook as pytest-benchmark's command line does). 37c90cc skipped such a file as "malformed result:
strategy: unknown value", and dropped the metric's column."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image

from harness import metrics
from harness.result import BenchResult
from pytest_llmbench.store import FACTS, ResultStore, metric_facts, strategy_facts

DATA = Path(__file__).resolve().parent.parent / "data"
PLUGIN = '''
import dataclasses

from harness import strategies

strategies.register(dataclasses.replace(strategies.get("ddp"), name="ddp-copy", color="#7f00ff"))
'''
CONFTEST = '''
def pytest_llmbench_metrics(config):
    from harness.metrics import Metric

    return [Metric("steps_per_s", "steps/s", "optimizer steps per second: 1 / mean step time", True,
                   fmt="{:.2f}", column="steps/s", derive=lambda r: 1 / r.metrics["step_time_mean_s"])]


def pytest_llmbench_report_sections(config):
    from pytest_llmbench.report.sections import Section

    return [Section("cases_count", lambda view: {"n": len(view.loaded.frame)}, after="header",
                    template="## Counted\\n\\n{{ n }} cases.\\n\\n")]
'''
METRIC_FACTS = {"steps_per_s": {
    "unit": "steps/s", "definition": "optimizer steps per second: 1 / mean step time", "higher": True,
    "trials": "mean", "fmt": "{:.2f}", "winner": None, "summary": None, "column": "steps/s"}}


def _as_plugin_store(tmp_path: Path) -> Path:
    """The committed store with DDP's results renamed to a plugin's ddp-copy, and the facts its session
    would have recorded."""
    out = tmp_path / "out"
    shutil.copytree(DATA / "store", out)
    for path in (out / "results").glob("*/*.json"):
        data = json.loads(path.read_text())
        if data["spec"]["strategy"] == "ddp":
            data["spec"]["strategy"] = "ddp-copy"
            data["metrics"]["steps_per_s"] = 1 / data["metrics"]["step_time_mean_s"]
            path.write_text(json.dumps(data))
            (path.parent / FACTS).write_text(json.dumps(
                {"strategies": {"ddp-copy": {"color": "#7f00ff", "doc": "a plugin's copy of DDP"}},
                 "metrics": METRIC_FACTS}))
    return out


def _report(out: Path, tmp_path: Path, plugin: bool) -> subprocess.CompletedProcess:
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    conftest = tmp_path / "conftest.py"
    if plugin:
        conftest.write_text(CONFTEST)
    elif conftest.exists():
        conftest.unlink()
    env = {"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "PYTHONPATH": str(tmp_path),
           **({"LLMBENCH_STRATEGIES": "my_plugin"} if plugin else {})}
    return subprocess.run([sys.executable, "-W", "error::UserWarning", "-m", "pytest_llmbench.report",
                           str(out), "--profile-file", str(DATA / "tinycpu.toml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_a_plugin_strategy_renders_with_and_without_its_plugin(tmp_path):
    out = _as_plugin_store(tmp_path)
    for plugin in (False, True):
        done = _report(out, tmp_path, plugin)
        assert done.returncode == 0, done.stderr  # -W error: a skipped file would fail it
        report = (out / "report" / "REPORT.md").read_text()
        assert "| tinycpu | ddp-copy | 2 | 64 |" in report, plugin
        assert "| efficiency | steps/s | status |" in report, plugin  # its column, from either
        assert ("## Counted\n" in report) == plugin  # the conftest's section, dispatched by the CLI
        assert "malformed" not in report
        table = (out / "report" / "metrics.csv").read_text()
        assert table.count(",ddp-copy,") >= 2
        rows = list(csv.DictReader(table.splitlines()))
        steps = [r["steps_per_s"] for r in rows if r["strategy"] == "ddp-copy"]
        assert len(steps) >= 2 and all(float(v) > 0 for v in steps), (plugin, steps)
        pixels = matplotlib.image.imread(out / "report" / "plots" / "tokens_per_s.png")[..., :3]
        violet = (abs(pixels[..., 0] - 0x7f / 255) < 0.02) & (pixels[..., 1] < 0.02) & (pixels[..., 2] > 0.98)
        assert violet.sum() > 20, plugin  # the recorded colour, or the row's: the same


def test_a_session_records_the_display_facts_of_its_strategies_and_plugin_metrics(tmp_path, monkeypatch):
    """Saving a result writes its strategy's colour and description, and each plugin metric's row less
    its derive, beside it; the store's readers take the facts file for no result."""
    steps = metrics.Metric("steps_per_s", "steps/s", "1 / mean step time", True, fmt="{:.2f}",
                           derive=lambda r: 1.0)
    monkeypatch.setitem(metrics._ADDED, "steps_per_s", steps)  # a plugin's, for this test only
    store = ResultStore(tmp_path)
    first = next((DATA / "store" / "results").glob("*/tinycpu-zero2-ws2-seq64.json"))
    data = json.loads(first.read_text())
    data.pop("profile")
    data["metrics"]["steps_per_s"] = 2.5
    store.save(BenchResult.from_dict(data), profile="tinycpu")
    assert strategy_facts(store.session_dir) == {
        "zero2": {"color": "#d62728", "doc": "DeepSpeed ZeRO stage 2"}}
    assert metric_facts(store.session_dir) == {"steps_per_s": {
        "unit": "steps/s", "definition": "1 / mean step time", "higher": True, "trials": steps.trials,
        "fmt": "{:.2f}", "winner": None, "summary": None, "column": None}}
    assert [r.spec.strategy for _, r in store.load_session(store.session_id)] == ["zero2"]
    (store.session_dir / FACTS).write_text('{"strategies": {"x": {"color": 3, "doc": "ok"}}}')
    assert strategy_facts(store.session_dir) == {"x": {"doc": "ok"}}  # untrusted: strings only


def test_a_plugin_instruments_stored_payloads_are_read_without_the_plugin(tmp_path):
    """A result whose spec asked for a plugin's instrument (``toy``) and whose ranks stored its payloads:
    before, ``ResultError: unknown instrument 'toy'`` and the file was skipped; now its name and payloads
    are data, and a case to run still refuses an instrument nobody registered."""
    import pytest

    from harness.spec import RunSpec, SpecError
    from pytest_llmbench.store import read_file

    data = json.loads(next(DATA.glob("store/results/*/tinycpu-ddp-ws2-seq64.json")).read_text())
    data["spec"]["instruments"] = {"toy": 3}
    data["instruments"] = {"toy": [{"rank": 0, "steps": 3}, {"rank": 1, "steps": 3}]}
    path = tmp_path / "tinycpu-ddp-ws2-seq64.json"
    path.write_text(json.dumps(data))
    profile, result = read_file(path)
    assert profile == "tinycpu" and result.spec.instruments == {"toy": 3}
    assert [p["steps"] for p in result.instruments["toy"]] == [3, 3]
    with pytest.raises(SpecError, match="instruments: unknown instrument 'toy'"):
        RunSpec.from_dict(data["spec"])
