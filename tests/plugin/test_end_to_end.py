"""Real runs through pytest: the plugin, the local launcher and the harness (tiny, CPU)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plugin.conftest import DATA


def test_cpu_case_end_to_end_with_a_threshold_made_to_fail(suite):
    # The same tiny profile with a memory budget no process can meet.
    text = (suite.path / "tinycpu.toml").read_text() + "\n[thresholds]\nmax_peak_memory_gib = 0.01\n"
    (suite.path / "tinycpu.toml").write_text(text)
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=2",
        "--llmbench-output=out", "--benchmark-json=bench.json", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*running tinycpu-ddp-ws1-seq64 first for scaling efficiency*",
        "*ddp-ws2-seq64: peak memory * GiB exceeds the tinycpu budget of 0.01 GiB (cpu_peak_rss)*",
        "*llmbench results*", "tinycpu-ddp-ws1-seq64 * ok", "tinycpu-ddp-ws2-seq64 * ok"])
    stored = sorted((suite.path / "out" / "results").glob("*/*.json"))
    assert [p.name for p in stored] == ["tinycpu-ddp-ws1-seq64.json", "tinycpu-ddp-ws2-seq64.json"]
    ws2 = json.loads(stored[1].read_text())
    assert ws2["status"] == "ok" and ws2["profile"] == "tinycpu"
    assert 0 < ws2["metrics"]["scaling_efficiency"] < 1.5
    assert ws2["metrics"]["scaling_baseline_world_size"] == 1
    bench = json.loads((suite.path / "bench.json").read_text())
    entry = bench["benchmarks"][0]
    assert entry["name"] == "test_training[tinycpu-ddp-ws2-seq64]"
    assert entry["stats"]["rounds"] == 4  # one round per measured step (6 steps, 2 warm-up)
    assert entry["stats"]["median"] == pytest.approx(ws2["metrics"]["step_time_median_s"])
    assert entry["extra_info"]["tokens_per_s"] == pytest.approx(ws2["metrics"]["tokens_per_s"])
    assert bench["machine_info"]["llmbench"]["torch"].startswith("2.")
    compare = subprocess.run([str(Path(sys.executable).parent / "pytest-benchmark"), "compare", "bench.json"],
                             cwd=suite.path, capture_output=True, text=True)
    assert compare.returncode == 0, compare.stderr
    assert "test_training[tinycpu-ddp-ws2-seq64]" in compare.stdout
    assert (suite.path / "out" / "report" / "REPORT.md").exists()
    assert (suite.path / "out" / "runs").is_dir()


def test_regression_gate_against_a_stored_run(suite):
    """--llmbench-fail-below fails a case that fell below the compared session."""
    out = suite.path / "out" / "results" / "20000101T000000Z-0000"
    out.mkdir(parents=True)
    data = json.loads(next(DATA.glob("store/results/*/tinycpu-ddp-ws1-seq64.json")).read_text())
    data["metrics"]["tokens_per_s"] *= 1000  # the stored run was impossibly fast
    (out / "tinycpu-ddp-ws1-seq64.json").write_text(json.dumps(data))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    # ~99.9% below; the last digit depends on this run's speed (a loaded host printed 100.0%)
    result.stdout.fnmatch_lines(["*tokens_per_s * is *% below the compared run's * (allowed 5%)*"])
    drop = re.search(r"tokens_per_s \S+ is ([\d.]+)% below", result.stdout.str())
    assert float(drop[1]) >= 99.5


def test_ctrl_c_stops_the_ranks_and_keeps_what_finished(suite):
    """A real SIGINT (what Ctrl-C sends) to pytest while a case runs: the finished case stays
    stored, the interrupted one is recorded with its status, and no rank outlives pytest."""
    env = {**os.environ, "LLMBENCH_FAULT": "1:hang"}  # rank 1 exists only in the ws2 case
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
         "--strategy=ddp", "--world-size=1,2", "--llmbench-output=out", "-p", "no:cacheprovider"],
        cwd=suite.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: any("fault injected on rank 1" in p.read_text(errors="replace")
                             for p in (suite.path / "out" / "runs").glob("*ws2*/logs/**/*.log")))
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    assert stored["tinycpu-ddp-ws1-seq64.json"]["status"] == "ok"
    interrupted = stored["tinycpu-ddp-ws2-seq64.json"]
    assert interrupted["status"] == "error" and "interrupted by Ctrl-C" in interrupted["error"]
    assert processes_mentioning(str(suite.path)) == []


def wait_for(condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s} s"
        time.sleep(0.2)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (the ranks name their run folder)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line:
            found.append(line)
    return found


def test_report_flag_rebuilds_without_running(pytester):
    results = pytester.path / "store" / "results"
    shutil.copytree(DATA / "store" / "results", results)
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=store")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmbench: report of 5 case(s) written to store*REPORT.md"])
    assert (pytester.path / "store" / "report" / "metrics.csv").exists()
    bad = results / "20990101T000000Z-0bad" / "x.json"
    bad.parent.mkdir()
    bad.write_text("{")
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=store")
    assert result.ret == 0
    result.stderr.fnmatch_lines(["*skipping store*x.json*"])


def test_report_of_one_session_and_of_a_session_not_stored(pytester):
    shutil.copytree(DATA / "store" / "results", pytester.path / "store" / "results")
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=store",
                                           "--llmbench-report-session=20261122T155250Z-1c5d")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmbench: report of 1 case(s) written to store*REPORT.md"])
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=store",
                                           "--llmbench-report-session=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*command line --llmbench-report-session: session(s) nope not found*"])


def test_report_flag_on_an_empty_store(pytester):
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=nothing")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmbench: no stored results under nothing*results; no report written"])
    assert not Path(pytester.path / "nothing" / "report").exists()
