"""The local launcher: two cases at once (as two suites on one host would run), progress lines."""

import re
import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest

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


def test_a_running_case_reports_its_steps_and_names_its_straggler(tmp_path):
    """Rank 1 takes twice as long over each step (LLMBENCH_SLOWDOWN=1:1.0). Its compute-only probe
    steps name it; its measured steps cannot: rank 0 waits in each step's collectives for rank 1,
    so both ranks' measured steps last as long."""
    lines: list[str] = []
    result = LocalLauncher(progress_every_s=0.1).run(
        tiny_spec(strategy="ddp", steps=8, compute_probe_steps=3), run_dir=tmp_path / "run", run_id="run",
        timeout_s=120, env={"DS_ACCELERATOR": "cpu", "LLMBENCH_SLOWDOWN": "1:1.0"}, progress=lines.append)
    assert result.ok, result.describe_failure()
    steps = [line for line in lines if re.match(r"train step \d+/8 (warmup|measure) time_s=", line)]
    assert steps, lines
    assert len(set(lines)) == len(lines)  # a line is reported once, not at every poll
    m = result.metrics
    assert (m["slowest_rank"], m["slowest_rank_share"]) == (1, 1.0)
    assert m["straggler_ratio"] > 1.15  # 2 / 1.5 = 1.33 with nothing else on the host
    rank0, rank1 = (statistics.median(p["step_times_s"]) for p in result.per_rank)
    assert rank0 == pytest.approx(rank1, rel=0.15)
