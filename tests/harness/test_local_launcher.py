"""The local launcher: two cases at once (as two suites on one host would run), progress lines."""

import re
from concurrent.futures import ThreadPoolExecutor

from pytest_llmbench.launchers.local import LocalLauncher
from tests.harness.conftest import launch, tiny_spec


def test_two_cases_at_once_each_get_their_own_rendezvous(tmp_path):
    spec = tiny_spec(strategy="ddp", steps=3, warmup_steps=1)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(launch, spec, tmp_path / name) for name in ("a", "b")]
        results = [run.result() for run in runs]
    assert [r.status for r in results] == ["ok", "ok"], [r.describe_failure() for r in results]
    assert results[0].run_id != results[1].run_id
    assert results[0].losses == results[1].losses  # same spec, same seed: same numbers


def test_a_running_case_reports_its_steps(tmp_path):
    lines: list[str] = []
    result = LocalLauncher(progress_every_s=0.1).run(
        tiny_spec(strategy="ddp", steps=8), run_dir=tmp_path / "run", run_id="run", timeout_s=120,
        env={"DS_ACCELERATOR": "cpu"}, progress=lines.append)
    assert result.ok
    steps = [line for line in lines if re.match(r"train step \d+/8 (warmup|measure) time_s=", line)]
    assert steps, lines
    assert len(set(lines)) == len(lines)  # a line is reported once, not at every poll
