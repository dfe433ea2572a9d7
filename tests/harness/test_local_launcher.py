"""The local launcher: two cases at once (as two suites on one host would run), progress lines."""

import re
import statistics
from concurrent.futures import ThreadPoolExecutor

from pytest_llmbench.launchers.local.launcher import LocalLauncher
from tests.harness.conftest import launch, tiny_spec


def test_two_cases_at_once_each_get_their_own_rendezvous(tmp_path):
    spec = tiny_spec(strategy="ddp", steps=3, warmup_steps=1)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(launch, spec, tmp_path / name) for name in ("a", "b")]
        results = [run.result() for run in runs]
    assert [r.status for r in results] == ["ok", "ok"], [r.describe_failure() for r in results]
    assert results[0].run_id != results[1].run_id
    assert results[0].losses == results[1].losses  # same spec, same seed: same numbers


def test_a_running_case_reports_its_steps_and_names_its_straggler(tmp_path, monkeypatch):
    """Rank 1 takes four times as long over each step (LLMBENCH_SLOWDOWN=1:3.0; at 2x, a rank 0
    descheduled by the other test file's ranks was slowest in 1 of 3 probe steps). Its compute-only
    probe steps name it; its measured steps cannot: rank 0 waits in each step's collectives for
    rank 1's sleep, so its measured steps last about four times its own compute. (Not "as long as
    rank 1's": rank 0's step k holds rank 1's sleep of step k-1, so under load the two ranks'
    medians were 30% apart in CI.)

    The same launch checks what the ranks' network settings were: the user's exported
    NCCL_SOCKET_IFNAME beats the profile's (gloo ignores it), and the result records both the
    settings each case ran with and the host's interfaces."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "from-the-shell")
    lines: list[str] = []
    result = LocalLauncher(progress_every_s=0.1).run(
        tiny_spec(strategy="ddp", steps=8, compute_probe_steps=3), run_dir=tmp_path / "run", run_id="run",
        timeout_s=120, env={"DS_ACCELERATOR": "cpu", "LLMBENCH_SLOWDOWN": "1:3.0",
                            "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}, progress=lines.append)
    assert result.ok, result.describe_failure()
    assert result.env["network_env"]["NCCL_SOCKET_IFNAME"] == "from-the-shell"
    assert result.env["network_env"]["NCCL_DEBUG"] == "WARN"  # what the shell did not set
    assert "lo" in result.env["interfaces"]
    steps = [line for line in lines if re.match(r"train step \d+/8 (warmup|measure) time_s=", line)]
    assert steps, lines
    assert len(set(lines)) == len(lines)  # a line is reported once, not at every poll
    m = result.metrics
    assert (m["slowest_rank"], m["slowest_rank_share"]) == (1, 1.0)
    assert m["straggler_ratio"] > 1.15  # 4 / 2.5 = 1.6 with nothing else on the host
    rank0 = result.per_rank[0]
    waited = statistics.median(rank0["step_times_s"]) / statistics.median(rank0["compute_only_step_times_s"])
    assert waited > 2  # about 4 (its compute, then rank 1's 3x sleep) with nothing else on the host


def test_a_case_cleans_up_its_own_processes_not_another_launch_with_its_run_id(tmp_path):
    """Two launches may share a run id (two tests' ``run`` folders at once, on two xdist workers): a
    case's clean-up once killed the other's torchrun (exited -9 without a result). Each launch marks its
    processes with the run id and a token of its own, and kills only those."""
    import os
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, "LLMBENCH_RUN_ID": "run"})
    try:
        result = launch(tiny_spec(strategy="ddp"), tmp_path / "run")
        assert result.ok, result.describe_failure()
        assert result.run_id == "run" and result.launch["mark"].startswith("run.")
        assert other.poll() is None, "another launch's process with the same run id was killed"
    finally:
        other.kill()
        other.wait()
