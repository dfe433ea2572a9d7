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
import torch

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
        "*ddp-ws2-seq64: peak memory * GiB exceeds the tinycpu budget of 0.01 GiB (cpu_peak_rss; mean of 1 "
        "trial(s), largest *): its one-sided 98% lower bound * GiB is above the budget*",
        "*llmbench results*", "tinycpu-ddp-ws1-seq64 * ok", "tinycpu-ddp-ws2-seq64 * ok"])
    stored = sorted((suite.path / "out" / "results").glob("*/*.json"))
    assert [p.name for p in stored] == ["tinycpu-ddp-ws1-seq64.json", "tinycpu-ddp-ws2-seq64.json"]
    ws2 = json.loads(stored[1].read_text())
    assert ws2["status"] == "ok" and ws2["profile"] == "tinycpu"
    assert 0 < ws2["metrics"]["scaling_efficiency"] < 2.0  # a number: single runs, shared cores
    assert ws2["metrics"]["scaling_baseline_world_size"] == 1
    ws1 = json.loads(stored[0].read_text())  # warm ranks by default: a pool per world size
    assert ws1["launch"]["mode"] == ws2["launch"]["mode"] == "warm"
    assert ws1["launch"]["pool"] != ws2["launch"]["pool"] and ws2["launch"]["case_index"] == 0
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


def on_this_host(data: dict) -> dict:
    """A committed stored result as if measured on this machine (its CPU model and cores: the stored-run
    gate compares a case with a session of the same machine only, pytest_llmbench/machine.py)."""
    from harness.env import collect_env

    here = collect_env(torch.device("cpu"), world_size=1, nnodes=1)
    data["env"].update({k: here[k] for k in ("device_name", "cpu", "cpu_count")})
    return data


def stored_case(name: str = "tinycpu-ddp-ws1-seq64") -> dict:
    return on_this_host(json.loads(next(DATA.glob(f"store/results/*/{name}.json")).read_text()))


def test_regression_gate_against_a_stored_run(suite):
    """--llmbench-fail-below fails a case that fell below the compared session."""
    out = suite.path / "out" / "results" / "20000101T000000Z-0000"
    out.mkdir(parents=True)
    data = stored_case()
    data["metrics"]["tokens_per_s"] *= 1000  # the stored run was impossibly fast
    (out / "tinycpu-ddp-ws1-seq64.json").write_text(json.dumps(data))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "--llmbench-fresh", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    new = [p for p in (suite.path / "out" / "results").glob("*/tinycpu-ddp-ws1-seq64.json")
           if p.parent != out]
    assert json.loads(new[0].read_text())["launch"]["mode"] == "fresh"  # one torchrun for the case
    # one trial a side: the declared launch noise is the spread, and a 1000x drop is far outside it
    result.stdout.fnmatch_lines(["*tokens_per_s dropped: mean * over 1 trial(s) vs * over 1 in the compared "
                                 "run, allowed drop 5%; new/old = *, upper bound * against the floor 0.950*"
                                 "false-alarm budget 2%*one trial a side*"])
    ratio = re.search(r"new/old = ([\d.]+)", result.stdout.str())
    assert float(ratio[1]) <= 0.005


def test_a_compared_run_this_version_cannot_read_fails_the_gate(suite):
    """Each stored file of the compared run carries a field a newer plugin writes: the gate skipped
    them all and passed the case, saying "not in the compared run" (issue 49). It cannot compare: fail."""
    out = suite.path / "out" / "results" / "20000101T000000Z-0000"
    out.mkdir(parents=True)
    data = stored_case()
    (out / "tinycpu-ddp-ws1-seq64.json").write_text(json.dumps({**data, "written_by_a_newer_plugin": 1}))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "--llmbench-fresh", "--llmbench-session-report=none", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["report: not written (command line --llmbench-session-report says none); "
                                 "write it with pytest --llmbench-report"])
    assert not (suite.path / "out" / "report").exists()
    result.stdout.fnmatch_lines(["*the compared run 20000101T000000Z-0000 holds 1 result file(s) this "
                                 "version cannot read (first: tinycpu-ddp-ws1-seq64.json: unknown result "
                                 "field(s): written_by_a_newer_plugin), and no readable result of this case: "
                                 "the gate cannot compare*"])


def test_the_gate_compares_only_the_same_case(suite):
    """A stored run of the same case id with another micro-batch (a profile edited since) is not the
    same case: no gate, and the warning says what differs (37c90cc reported a 98% drop)."""
    out = suite.path / "out" / "results" / "20000101T000000Z-0000"
    out.mkdir(parents=True)
    data = stored_case()
    data["metrics"]["tokens_per_s"] *= 1000
    mb = data["spec"]["micro_batch"]
    data["spec"]["micro_batch"] = mb * 2
    (out / "tinycpu-ddp-ws1-seq64.json").write_text(json.dumps(data))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "--llmbench-fresh", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([f"*tinycpu-ddp-ws1-seq64*the compared run's case of this id is not the same "
                                 f"case (micro_batch {mb * 2} -> {mb}); no regression gate*"])


def test_a_stored_run_of_another_machine_is_no_baseline(suite):
    """The compared session measured the case on another machine (two more cores here): its numbers
    are no baseline for this one, and the gate, unable to compare, fails the case saying both machines
    (it passed before: a 1000x slower store read as a 1000x speed-up)."""
    out = suite.path / "out" / "results" / "20000101T000000Z-0000"
    out.mkdir(parents=True)
    data = stored_case()
    data["metrics"]["tokens_per_s"] /= 1000
    data["env"]["cpu_count"] += 2
    (out / "tinycpu-ddp-ws1-seq64.json").write_text(json.dumps(data))
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "--llmbench-fresh", "--llmbench-session-report=none", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    cores = data["env"]["cpu_count"]
    result.stdout.fnmatch_lines([f"*the compared run 20000101T000000Z-0000 measured this case on '* {cores} "
                                 f"cores, 1 node(s)', this session on '* {cores - 2} cores, 1 node(s)': "
                                 "another machine's numbers are no baseline, so the gate cannot compare*"])


@pytest.mark.parametrize("signum, said, presses", [(signal.SIGINT, "interrupted by Ctrl-C", 1),
                                                   (signal.SIGTERM, "stopped by SIGTERM", 1),
                                                   (signal.SIGINT, "interrupted by Ctrl-C", 2)])
def test_ctrl_c_or_sigterm_stops_the_ranks_and_keeps_what_finished(suite, signum, said, presses):
    """A real SIGINT (what Ctrl-C sends) or SIGTERM (what CI cancellation, ``timeout`` and
    schedulers send) to pytest while a case runs: the finished case stays stored, the stopped
    one is recorded with its status and reason, the summary is printed, pytest exits as
    interrupted, and no rank outlives it. Ctrl-C pressed twice 0.05 s apart stored nothing for the
    stopped case before (the second unwound the first's stop): the second now waits for it."""
    env = {**os.environ, "LLMBENCH_FAULT": "1:hang"}  # rank 1 exists only in the ws2 case
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
         "--strategy=ddp", "--world-size=1,2", "--llmbench-output=out", "-p", "no:cacheprovider"],
        cwd=suite.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # a runner started in the background ignores SIGINT and its children inherit that; this
        # pytest must get Ctrl-C as a terminal gives it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: any("fault injected on rank 1" in p.read_text(errors="replace")
                             for p in (suite.path / "out" / "runs").glob("*ws2*/logs/**/*.log")))
        for press in range(presses):
            time.sleep(0.05 * press)
            proc.send_signal(signum)
        output = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    assert stored["tinycpu-ddp-ws1-seq64.json"]["status"] == "ok"
    interrupted = stored["tinycpu-ddp-ws2-seq64.json"]
    assert interrupted["status"] == "error" and f"{said}; ranks stopped" in interrupted["error"]
    assert ("1 more stop signal(s) came while the case was stopped" in output) == (presses > 1)
    assert "llmbench results" in output and "tinycpu-ddp-ws2-seq64" in output.split("llmbench results")[1]
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
    result.stdout.fnmatch_lines(
        ["llmbench: report of 5 case(s) written to store*REPORT.md (and REPORT.html)"])
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
    result.stdout.fnmatch_lines(
        ["llmbench: report of 1 case(s) written to store*REPORT.md (and REPORT.html)"])
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=store",
                                           "--llmbench-report-session=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*command line --llmbench-report-session: session(s) nope not found*"])


def test_report_flag_on_an_empty_store(pytester):
    result = pytester.runpytest_subprocess("--llmbench-report", "--llmbench-output=nothing")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["llmbench: no stored results under nothing*results; no report written"])
    assert not Path(pytester.path / "nothing" / "report").exists()


def stored_trials(folder: Path, name: str, tokens_per_s: list[float]) -> None:
    """A compared session's trials of a case, with the tokens/s given, run on this host's CPU (the
    report keeps a case run on another device apart: the committed store's CPU need not be this)."""
    data = on_this_host(json.loads(next(DATA.glob(f"store/results/*/{name}.json")).read_text()))
    for k, value in enumerate(tokens_per_s, 1):
        data.update(trial=k, run_id=f"old-{name}-{k}", schema_version=2)
        data["metrics"] = {**data["metrics"], "tokens_per_s": value}
        (folder / f"{name}{f'-trial{k}' if k > 1 else ''}.json").write_text(json.dumps(data))


def test_trials_interleave_store_aggregate_and_settle_the_gate(suite):
    """Two cases x --llmbench-trials 2 run in balanced rounds, each trial stored; the last trial's test
    checks the aggregate. The gate against a stored run: zero2 was 1000x faster there with a
    tight spread (a clear drop: fail); ddp there has a spread so wide that no number of trials
    settles it, so --llmbench-trials-max=3 runs a third trial, then calls it inconclusive."""
    old = suite.path / "out" / "results" / "20000101T000000Z-0000"
    old.mkdir(parents=True)
    stored_trials(old, "tinycpu-ddp-ws1-seq64", [600.0, 60_000.0])
    stored_trials(old, "tinycpu-zero2-ws1-seq64", [5e6, 5.05e6, 4.95e6])
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--world-size=1", "--llmbench-trials=2",
        "--llmbench-output=out", "--llmbench-compare=last", "--llmbench-fail-below=tokens_per_s:5%",
        "--llmbench-trials-max=3", "--benchmark-json=bench.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
    launched = re.findall(r"\[llmbench\] (tinycpu-\S+ trial \d/\d): launching", result.stdout.str())
    assert launched == ["tinycpu-ddp-ws1-seq64 trial 1/2", "tinycpu-zero2-ws1-seq64 trial 1/2",
                        "tinycpu-zero2-ws1-seq64 trial 2/2", "tinycpu-ddp-ws1-seq64 trial 2/2",
                        "tinycpu-ddp-ws1-seq64 trial 3/3"]
    out = result.stdout
    out.fnmatch_lines(["*tinycpu-ddp-ws1-seq64: tokens_per_s gate undecided (*); running trial 3 of at "
                       "most 3*", "FAILED test_suite.py::test_training[tinycpu-zero2-ws1-seq64-trial2]*"])
    out.fnmatch_lines(["*zero2-ws1-seq64: tokens_per_s dropped: mean * over 2 trial(s) vs 5e+06 over 3 in "
                       "the compared run, allowed drop 5%; new/old = 0.00*, upper bound * against the floor "
                       "0.950*"])
    out.fnmatch_lines(["*tinycpu-ddp-ws1-seq64: tokens_per_s inconclusive: mean * over 3 trial(s)*"
                       "inconclusive at the last look*"])
    stored = sorted(p.name for p in (suite.path / "out" / "results").glob("*/*.json") if p.parent != old)
    assert stored == ["tinycpu-ddp-ws1-seq64-trial2.json", "tinycpu-ddp-ws1-seq64-trial3.json",
                      "tinycpu-ddp-ws1-seq64.json", "tinycpu-zero2-ws1-seq64-trial2.json",
                      "tinycpu-zero2-ws1-seq64.json"]
    summary = re.search(r"tinycpu-zero2-ws1-seq64 +2 of 2 +(\d+) ", result.stdout.str())
    per_trial = [float(m) for m in re.findall(r"tinycpu-zero2-ws1-seq64 #\d +(\d+)", result.stdout.str())]
    assert len(per_trial) == 2 and abs(float(summary[1]) - sum(per_trial) / 2) <= 1
    bench = {b["name"]: b for b in json.loads((suite.path / "bench.json").read_text())["benchmarks"]}
    last = bench["test_training[tinycpu-ddp-ws1-seq64-trial2]"]["extra_info"]
    assert last["llmbench_trial"] == 2 and last["llmbench_trials_ok"] == 3
    low, mean, high = (last[f"trials_tokens_per_s_{k}"] for k in ("low", "mean", "high"))
    assert low < mean < high
    csv = (suite.path / "out" / "report" / "metrics.csv").read_text().splitlines()
    assert len(csv) == 1 + 5  # header and this session's 5 trials (the compared run's are older runs)


def test_trials_reverse_the_world_sizes_in_alternate_rounds_and_pair_each_round(suite):
    """Two trials of ddp at ws1 and ws2: round 1 runs ws2 then its baseline (world sizes reversed,
    cases.baseline_last), round 2 the baseline first. No baseline is run twice, each ws2 trial's
    stored efficiency is against its own round's ws1, and the floor is checked on both pairs."""
    floor = "\n[thresholds]\nmin_scaling_efficiency = { 2 = 0.01 }\n"
    (suite.path / "tinycpu.toml").write_text((suite.path / "tinycpu.toml").read_text() + floor)
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1,2",
        "--llmbench-trials=2", "--llmbench-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    launched = re.findall(r"\[llmbench\] (tinycpu-\S+ trial \d/\d): launching", result.stdout.str())
    assert launched == ["tinycpu-ddp-ws2-seq64 trial 1/2", "tinycpu-ddp-ws1-seq64 trial 1/2",
                        "tinycpu-ddp-ws1-seq64 trial 2/2", "tinycpu-ddp-ws2-seq64 trial 2/2"]
    assert "first for scaling efficiency" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*tinycpu-ddp-ws1-seq64 trial 1/2: paired with ws2 of this round, which ran "
                                 "before it: scaling efficiency *"])
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    assert len(stored) == 4
    for name, base in (("tinycpu-ddp-ws2-seq64.json", "tinycpu-ddp-ws1-seq64.json"),
                       ("tinycpu-ddp-ws2-seq64-trial2.json", "tinycpu-ddp-ws1-seq64-trial2.json")):
        scaled, baseline = stored[name]["metrics"], stored[base]["metrics"]
        assert scaled["scaling_baseline_run_id"] == stored[base]["run_id"]
        expected = scaled["tokens_per_s"] / (2 * baseline["tokens_per_s"])
        assert scaled["scaling_efficiency"] == pytest.approx(expected)
        assert scaled["exposed_comm_s"] is not None


FULL_DISK = '''
import errno

import pytest_llmbench.report.build
import pytest_llmbench.store

saves = []
real = pytest_llmbench.store.write_atomic


def fill_up(path, text, **kwargs):
    """The disk fills up after the first stored result: every later write fails as it would."""
    saves.append(path)
    if len(saves) > 1:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return real(path, text, **kwargs)


def no_space(path, text, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


pytest_llmbench.store.write_atomic = fill_up
pytest_llmbench.report.build.write_atomic = no_space
'''


def test_a_full_disk_fails_the_case_it_hit_and_keeps_what_was_stored(suite):
    """ENOSPC while storing the second result and while writing the report: that case fails
    with the reason, the first result stays stored and readable, the summary still prints and
    pytest ends with a failed test (exit 1), not an internal error."""
    suite.makeconftest(FULL_DISK)
    result = suite.runpytest_subprocess("-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
                                        "--strategy=ddp", "--world-size=1,2", "--llmbench-output=out",
                                        "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*tinycpu-ddp-ws2-seq64: measured but not stored under *out/results/*: [[]Errno 28[]] No space*",
        "*llmbench results*", "tinycpu-ddp-ws1-seq64 * ok", "tinycpu-ddp-ws2-seq64 * ok",
        "report: not written: [[]Errno 28[]] No space left on device*; rebuild it with *--llmbench-report"])
    stored = [json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")]
    assert [(r["case_id"], r["status"]) for r in stored] == [("ddp-ws1-seq64", "ok")]
