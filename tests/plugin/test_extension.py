"""A new strategy, launcher, metric, instrument and report section from outside the package: each
is one registration, with no file of pytest-llmbench changed. The strategy is a copy of DDP's row under a
name with a '-' in it (which the report once split as workload-strategy), the launcher a relay to
the local one that records every case it ran, the metric optimizer steps per second, the instrument
a module that runs its own steps after the measured ones on every rank and derives a metric row
from what each rank recorded, the section a table of that row placed after Scaling. One session
runs all five through the plugin, the report and the projection."""

import csv
import json

import matplotlib.image
import pytest

TOY_STRATEGY = '''
import dataclasses

from harness import strategies

strategies.register(dataclasses.replace(strategies.get("ddp"), name="ddp-copy", color="#7f00ff"))
'''

RELAY_LAUNCHER = '''
from pathlib import Path

from pytest_llmbench.launchers import LauncherKind
from pytest_llmbench.launchers.local import LocalLauncher

RELAYED = Path(__file__).parent / "relayed.txt"


class Relay:
    def run(self, spec, *, run_dir, run_id, timeout_s, env, progress):
        with RELAYED.open("a") as log:
            log.write(run_id + "\\n")
        return LocalLauncher().run(spec, run_dir=run_dir, run_id=run_id, timeout_s=timeout_s, env=env,
                                   progress=progress)


def pytest_llmbench_metrics(config):
    from harness.metrics import Metric

    return [Metric("steps_per_s", "steps/s", "optimizer steps per second: 1 / mean step time", True,
                   fmt="{:.2f}", summary=("steps/s", ".2f"), column="steps/s",
                   derive=lambda r: 1 / r.metrics["step_time_mean_s"])]


def pytest_llmbench_report_sections(config):
    from pytest_llmbench.report.sections import Section

    def toy_rows(view):
        ok = view.loaded.frame[view.loaded.frame.status == "ok"]
        return {"toy": [{"case": r.case_id, "steps": f"{r.toy_steps:.0f}"} for r in ok.itertuples()]}

    return [Section("toy", toy_rows, after="scaling", template=(
        "## Toy steps\\n\\n| case | steps |\\n|---|---|\\n"
        "{% for r in toy %}| {{ r.case }} | {{ r.steps }} |\\n{% endfor %}\\n"))]


def pytest_llmbench_launchers(config):
    return [LauncherKind(name="relay", doc="the local launcher, relayed",
                         make=lambda settings, profile: Relay(), host_lock=True, on_this_host=True,
                         marker=True)]
'''

TOY_INSTRUMENT = '''
from harness import instruments
from harness.metrics import LATEST, Metric


def record(run):
    """Train ``run.steps`` more steps; this rank's count and its last loss."""
    from harness.parallel.engine import train_step

    losses = [train_step(run.engine, batch).item() for batch in run.step_batches(run.steps)]
    return {"rank": run.rank, "steps": len(losses), "last_loss": losses[-1]}


def derive(payloads):
    return {"toy_steps": sum(p["steps"] for p in payloads) if payloads else None}


instruments.register(
    instruments.Instrument("toy", "trains a few more steps and counts them", __name__,
                           metrics=("toy_steps",)),
    Metric("toy_steps", "steps", "steps the toy instrument ran, summed over ranks", trials=LATEST))
'''

PROBE = '''
def test_collectives(llmbench, llmbench_probe):
    llmbench.check(llmbench.run(llmbench_probe))
'''


def test_a_registered_strategy_runs_through_a_registered_launcher_and_is_reported(suite, monkeypatch):
    suite.makepyfile(toy_strategy=TOY_STRATEGY, toy_instrument=TOY_INSTRUMENT, conftest=RELAY_LAUNCHER,
                     test_probe=PROBE)
    monkeypatch.setenv("LLMBENCH_STRATEGIES", "toy_strategy")  # read by pytest and by every rank
    monkeypatch.setenv("LLMBENCH_INSTRUMENTS", "toy_instrument")
    monkeypatch.setenv("PYTHONPATH", str(suite.path))
    profile = suite.path / "tinycpu.toml"
    profile.write_text(profile.read_text().replace("collectives = false",
                                                   "collectives = true\ncollectives_max_bytes = 65536"))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu and relay", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp-copy",
        "--world-size=1,2", "--llmbench-launcher=relay", "--llmbench-output=out",
        "--llmbench-instrument=toy=3", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    relayed = (suite.path / "relayed.txt").read_text().split()
    assert sorted(r.rsplit("-", 1)[0] for r in relayed) == [
        "tinycpu-collectives-ws2", "tinycpu-ddp-copy-ws1-seq64", "tinycpu-ddp-copy-ws2-seq64"]
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    ws2 = stored["tinycpu-ddp-copy-ws2-seq64.json"]
    assert ws2["status"] == "ok" and ws2["spec"]["strategy"] == "ddp-copy"
    assert ws2["strategy_config"]["wrapper"] == "DistributedDataParallel"  # DDP's engine, from the row
    assert ws2["metrics"]["scaling_efficiency"] > 0  # against its own ws1 baseline
    assert ws2["metrics"]["steps_per_s"] == 1 / ws2["metrics"]["step_time_mean_s"]  # the plugin's metric
    # the instrument: its steps on every rank, after the measured ones, its row derived on rank 0
    assert ws2["spec"]["instruments"] == {"toy": 3}
    assert [(p["rank"], p["steps"]) for p in ws2["instruments"]["toy"]] == [(0, 3), (1, 3)]
    assert ws2["metrics"]["toy_steps"] == 6 and ws2["phases_s"]["toy_s"] > 0
    assert len(ws2["step_times_s"]) == ws2["spec"]["steps"] - ws2["spec"]["warmup_steps"]  # none measured
    result.stdout.fnmatch_lines(["*steps/s*status", "tinycpu-ddp-copy-ws2-seq64 * ok"])
    with (suite.path / "out" / "report" / "metrics.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 2 and [float(r["steps_per_s"]) for r in rows] == pytest.approx(
        [1 / float(r["step_time_mean_s"]) for r in rows])
    assert [float(r["toy_steps"]) for r in rows] == [3, 6]  # the instrument's row is a column like any other
    report = (suite.path / "out" / "report" / "REPORT.md").read_text()
    toy = report.split("## Toy steps\n")[1]
    assert "| ddp-copy-ws1-seq64 | 3 |\n| ddp-copy-ws2-seq64 | 6 |\n" in toy  # the section's own rows
    assert report.index("## Scaling") < report.index("## Toy steps") < report.index("## Collectives")
    assert "| exposed comm. | efficiency | steps/s | status |" in report  # All cases: the metric's column
    assert "| tinycpu | ddp-copy (relay) | 2 | 64 |" in report  # its own label and launcher, never "ddp"
    projected = report.split("## Projection (projected, not measured)")[1].split("Validation")[0]
    assert "| tinycpu | ddp-copy seq64 | 256 |" in projected  # projected with DDP's sends, from its row
    # drawn in its own colour: the throughput plot holds pixels of the row's #7f00ff
    pixels = matplotlib.image.imread(suite.path / "out" / "report" / "plots" / "tokens_per_s.png")[..., :3]
    violet = (abs(pixels[..., 0] - 0x7f / 255) < 0.02) & (pixels[..., 1] < 0.02) & (pixels[..., 2] > 0.98)
    assert violet.sum() > 50


def test_an_unknown_launcher_names_the_registered_ones(suite):
    suite.makepyfile(conftest=RELAY_LAUNCHER)
    result = suite.runpytest_subprocess("--llmbench-launcher=nope", "--llmbench-profile-file=tinycpu.toml",
                                        "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*command line --llmbench-launcher: unknown value 'nope'; choose from "
                                 "local, k8s, slurm, relay*"])
