"""A new strategy, launcher, metric, instrument and report section from outside the package: each
is one registration, with no file of pytest-llmbench changed. The strategy is no copy of a built-in one:
its own engine (a hook all-reduces each gradient once the last micro-batch has accumulated it) and its
own row, under a name with a '-' in it (which the report once split as workload-strategy); the
planner, the step-time predictor, the memory instrument, the projection and the report handle it from
its row alone. The launcher is a relay to
the local one that records every case it ran, the metric optimizer steps per second, the instrument
a module that runs its own steps after the measured ones on every rank and derives a metric row
from what each rank recorded, the section a table of that row placed after Scaling. One session
runs all five through the plugin, the report and the projection."""

import csv
import json

import matplotlib.image
import pytest

TOY_STRATEGY = '''
import contextlib

import torch.distributed as dist
from torch import nn

from harness import strategies
from harness.parallel.engine import TorchEngine, apply_before_wrap, common_config, make_optimizer


def build(model, spec, device):
    """Each gradient all-reduced by its own hook once the last micro-batch has accumulated it."""
    config = common_config(spec)
    apply_before_wrap(model, spec, config)
    state = {"last": True}

    def reduce(param):
        if state["last"]:
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(reduce)

    @contextlib.contextmanager
    def sync(last):
        state["last"] = last
        yield

    config.update(wrapper="hand-rolled: a post-accumulate-grad hook all-reduces each gradient")
    engine = TorchEngine(model, make_optimizer(model, spec), spec=spec, device=device, sync=sync,
                         clip=lambda c: nn.utils.clip_grad_norm_(model.parameters(), c))
    return engine, config


strategies.register(strategies.Strategy(
    "hand-allreduce", __name__, "each gradient all-reduced by a hook, one collective a parameter",
    "#7f00ff", frozenset(), (strategies.Send("all_reduce", "grads", "step"),), variants=frozenset({"ac"}),
    memory="replicated"))
'''

RELAY_LAUNCHER = '''
from pathlib import Path

from pytest_llmbench.launchers import LauncherKind
from pytest_llmbench.launchers.local.launcher import LocalLauncher

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
    monkeypatch.setenv("LLMBENCH_SESSION_REPORT", "full")  # its plot is read below
    profile = suite.path / "tinycpu.toml"
    profile.write_text(profile.read_text().replace("collectives = false",
                                                   "collectives = true\ncollectives_max_bytes = 65536"))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu and relay", "--llmbench-profile-file=tinycpu.toml", "--strategy=hand-allreduce",
        "--world-size=1,2", "--llmbench-launcher=relay", "--llmbench-output=out",
        "--llmbench-instrument=toy=3", "--llmbench-memory", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    relayed = (suite.path / "relayed.txt").read_text().split()
    assert sorted(r.rsplit("-", 1)[0] for r in relayed) == [
        "tinycpu-collectives-ws2", "tinycpu-hand-allreduce-ws1-seq64", "tinycpu-hand-allreduce-ws2-seq64"]
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    ws2 = stored["tinycpu-hand-allreduce-ws2-seq64.json"]
    assert ws2["status"] == "ok" and ws2["spec"]["strategy"] == "hand-allreduce"
    assert ws2["strategy_config"]["wrapper"].startswith("hand-rolled")  # its own engine, named by its row
    sent = {m["op"] for m in ws2["traffic"]}
    assert "all_reduce" in sent and sum(m["count"] for m in ws2["traffic"] if m["op"] == "all_reduce") > 10
    # the memory instrument tracked it with MemTracker (the row's default tracker), on both ranks
    assert [p["tracker"] for p in ws2["instruments"]["memory"]] == ["MemTracker", "MemTracker"]
    assert ws2["metrics"]["scaling_efficiency"] > 0  # against its own ws1 baseline
    assert ws2["metrics"]["steps_per_s"] == 1 / ws2["metrics"]["step_time_mean_s"]  # the plugin's metric
    # the instrument: its steps on every rank, after the measured ones, its row derived on rank 0
    assert ws2["spec"]["instruments"] == {"toy": 3, "memory": 1}
    assert [(p["rank"], p["steps"]) for p in ws2["instruments"]["toy"]] == [(0, 3), (1, 3)]
    assert set(ws2["instruments"]) == {"toy", "memory"}
    assert ws2["metrics"]["toy_steps"] == 6 and ws2["phases_s"]["toy_s"] > 0
    assert len(ws2["step_times_s"]) == ws2["spec"]["steps"] - ws2["spec"]["warmup_steps"]  # none measured
    result.stdout.fnmatch_lines(["*steps/s*status", "tinycpu-hand-allreduce-ws2-seq64 * ok"])
    with (suite.path / "out" / "report" / "metrics.csv").open() as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == 2 and [float(r["steps_per_s"]) for r in rows] == pytest.approx(
        [1 / float(r["step_time_mean_s"]) for r in rows])
    assert [float(r["toy_steps"]) for r in rows] == [3, 6]  # the instrument's row is a column like any other
    report = (suite.path / "out" / "report" / "REPORT.md").read_text()
    toy = report.split("## Toy steps\n")[1]
    # the section's own rows
    assert "| hand-allreduce-ws1-seq64 | 3 |\n| hand-allreduce-ws2-seq64 | 6 |\n" in toy
    assert report.index("## Scaling") < report.index("## Toy steps") < report.index("## Collectives")
    assert "| exposed comm. | efficiency | steps/s | status |" in report  # All cases: the metric's column
    assert "| tinycpu | hand-allreduce (relay) | 2 | 64 |" in report  # its own label and launcher
    projected = report.split("## Projection (projected, not measured)")[1].split("Validation")[0]
    assert "| tinycpu | hand-allreduce seq64 | 256 |" in projected  # projected with its row's sends
    # drawn in its own colour: the throughput plot holds pixels of the row's #7f00ff
    pixels = matplotlib.image.imread(suite.path / "out" / "report" / "plots" / "tokens_per_s.png")[..., :3]
    violet = (abs(pixels[..., 0] - 0x7f / 255) < 0.02) & (pixels[..., 1] < 0.02) & (pixels[..., 2] > 0.98)
    assert violet.sum() > 50


def test_the_planner_and_the_predictor_read_a_registered_strategy_from_its_row(tmp_path, monkeypatch):
    """llmbench-plan, memory and step time, for the registered strategy (not a copy of a built-in one):
    its row says it replicates everything and sends all_reduce(grads) a step, so its plan is DDP's
    formula by its declared memory, and its optimizer is not sharded in the prediction. It names no
    bookkeeping rule: its step is DDP's less DDP's reducer copies, and the answer says so."""
    import subprocess
    import sys

    (tmp_path / "toy_strategy.py").write_text(TOY_STRATEGY)
    env = {**__import__("os").environ, "LLMBENCH_STRATEGIES": "toy_strategy", "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest_llmbench.planner.cli", "--model", "gpt2-124m", "--seq-len", "128",
            "--world-size", "8", "--activation-gib", "1", "--device", "h100-sxm", "--time", "--json"]
    plans = {}
    for strategy in ("hand-allreduce", "ddp"):
        done = subprocess.run([*argv, "--strategy", strategy], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        plans[strategy] = json.loads(done.stdout)["plans"][0]["world_sizes"]["8"]
    toy, ddp = plans["hand-allreduce"], plans["ddp"]
    assert toy["total_bytes"] == ddp["total_bytes"]
    assert toy["terms_s"]["bookkeeping"] == 0 < ddp["terms_s"]["bookkeeping"]
    assert toy["step_time_s"] == pytest.approx(ddp["step_time_s"] - ddp["terms_s"]["bookkeeping"])
    assert toy["not_stated"] and "not_stated" not in ddp
    assert toy["terms_s"]["optimizer"] == ddp["terms_s"]["optimizer"]  # not sharded: the row says so


def test_an_unknown_launcher_names_the_registered_ones(suite):
    suite.makepyfile(conftest=RELAY_LAUNCHER)
    result = suite.runpytest_subprocess("--llmbench-launcher=nope", "--llmbench-profile-file=tinycpu.toml",
                                        "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*command line --llmbench-launcher: unknown value 'nope'; choose from "
                                 "local, k8s, slurm, relay*"])
