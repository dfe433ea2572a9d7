"""Failures and bad input: each becomes a recorded result or a clear exit-2 message."""

import json

import pytest

from pytest_llmbench.launchers import procs
from tests.harness.conftest import case_mark, launch, run_harness, tiny_spec


@pytest.mark.parametrize("spec, message", [
    ({"strategy": "zero4"}, "strategy: unknown value 'zero4'"),
    ({"seq_len": 9999}, "seq_len: 9999 exceeds the model's 512 positions"),
    ({"steps": 2, "warmup_steps": 2}, "steps: 2 must be greater than warmup_steps"),
    ({"micro_batch": 0}, "micro_batch: 0 must be >= 1"),
    ("{broken", "not valid JSON"),
])
def test_bad_spec_exits_2_with_one_message(tmp_path, spec, message):
    proc = run_harness(spec, tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_world_size_must_match_torchrun(tmp_path):
    proc = run_harness({"world_size": 2}, tmp_path, env={"WORLD_SIZE": "1"})
    assert proc.returncode == 2
    assert "spec says 2 but torchrun started WORLD_SIZE=1" in proc.stderr


def test_unreadable_spec_file(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "harness", "--spec", str(tmp_path / "nope.json"),
                           "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot read it" in proc.stderr


def test_a_spec_the_harness_rejects_is_recorded_with_its_reason(tmp_path, pools):
    """A spec the launcher sent but every rank refuses (here: a strategy this harness does not
    know, as from another version of it) is recorded with the harness's own words, fresh and warm
    (37c90cc: "torchrun exited 1 without a result", and "exited None" on warm ranks)."""
    spec = tiny_spec(strategy="ddp")
    object.__setattr__(spec, "strategy", "zero4")  # past RunSpec's own check, as a stale spec would be
    result = launch(spec, tmp_path / "run", pools=pools)
    assert result.status == "error"
    assert result.error.startswith("the harness rejected the spec: "), result.error
    assert "spec.json: strategy: unknown value 'zero4'; choose one of ddp" in result.error
    assert procs.find("LLMBENCH_RUN_ID", case_mark(result)) == []


@pytest.mark.parametrize("fault, status", [("raise", "error"), ("oom", "oom")])
def test_a_failing_rank_is_a_recorded_result(tmp_path, fault, status, pools):
    result = launch(tiny_spec(strategy="ddp"), tmp_path / "run", env={"LLMBENCH_FAULT": f"1:{fault}"},
                    pools=pools)
    assert result.status == status
    assert result.failed_rank == 1
    assert "injected" in result.error and "Traceback" in result.error
    assert "injected" in result.log_tail
    stored = json.loads((tmp_path / "run" / "result.json").read_text())
    assert stored["status"] == status


def test_a_rank_that_dies_without_a_traceback(tmp_path, pools):
    result = launch(tiny_spec(strategy="fsdp"), tmp_path / "run", env={"LLMBENCH_FAULT": "0:exit"},
                    pools=pools)
    assert result.status == "error"
    # rank 1 may record the broken connection, but the root cause is rank 0's exit
    assert result.failed_rank == 0
    assert "rank 0" in result.error and "exit code 3" in result.error
    assert "fault injected on rank 0" in result.log_tail


def fault_timeout(pools) -> int:
    """Long enough for both ranks to start and reach the fault on a loaded 2-core machine, so the
    log holds the fault's own line. A warm case's clock starts once its pool is up: 25 s. A fresh
    case's includes torchrun's and each rank's imports: 25 s was once too short under CI's load
    (two test files at once and the offline tests beside them), with nothing yet in either rank's log."""
    return 25 if pools else 45


def test_a_hang_and_a_frozen_rank_time_out_and_no_process_survives(tmp_path, pools):
    """One case, two stuck ranks: rank 0 sleeps in Python (it dies of torchrun's SIGTERM) and rank 1
    is SIGSTOPped (frozen, deaf to SIGTERM). The case is a timeout that says which ranks were working,
    every process of it is killed, and when run() returns none is left. (One launch for both: each
    waits out the whole timeout, the suite's longest idle waits.)"""
    result = launch(tiny_spec(strategy="ddp"), tmp_path / "run", timeout_s=fault_timeout(pools),
                    env={"LLMBENCH_FAULT": "0:hang,1:stop"}, pools=pools)
    assert procs.find("LLMBENCH_RUN_ID", case_mark(result)) == []  # at once, not eventually
    assert result.status == "timeout", result.describe_failure()
    assert "every process of the " in result.error and " killed" in result.error
    assert "ranks making progress: none; not making progress: rank 0 (" in result.error
    assert "rank 1 (no step line yet; process stopped by a signal" in result.error
    assert "fault injected on rank 0: hang" in result.log_tail
    assert "fault injected on rank 1: stop" in result.log_tail
    # stopped soon after its timeout: the pool's own start-up (its ranks' imports) is not the
    # case's (69 s in all once, under CI's load)
    assert result.wall_time_s - result.launch.get("pool_start_s", 0.0) < fault_timeout(pools) + 35


def test_a_sigkill_without_oom_evidence_is_not_called_oom(tmp_path, pools):
    """A rank SIGKILLed by someone (an operator, a preemption): the OOM killer's counters did
    not move, so the status is error and the words say the cause is unknown."""
    result = launch(tiny_spec(strategy="ddp"), tmp_path / "run", env={"LLMBENCH_FAULT": "1:sigkill"},
                    pools=pools)
    assert result.status == "error", result.describe_failure()
    assert result.failed_rank == 1
    # "root cause: rank 1 killed by ..." or, if rank 0 recorded the broken connection first,
    # "rank 1 died (killed by ...) without recording a failure"
    assert "killed by SIGKILL (cause unknown: the kernel's OOM killer counts" in result.error
    assert procs.find("LLMBENCH_RUN_ID", case_mark(result)) == []
