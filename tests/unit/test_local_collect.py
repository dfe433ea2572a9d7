"""Which rank the local launcher blames, from result.json and torchrun's failure listing.

torchrun stamps failures to the second, so its "Root Cause" is a tie-break among ranks
that failed together; the rank that wrote result.json first (exclusive create) is trusted
unless another rank died without recording anything (exit code other than 1)."""

from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.launchers.local.launcher import _collect

SPEC = RunSpec.from_preset("tiny", world_size=2, seq_len=64, steps=4, warmup_steps=1)


def torchrun_log(root: tuple[int, int], other: tuple[int, int]) -> str:
    def entry(rank, code):
        return (f"[{rank}]:\n  time      : 2026-11-22_21:10:45\n  host      : localhost\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 1)\n")
    return ("harness FAILED\nFailures:\n" + entry(*other) + "-----\n"
            "Root Cause (first observed failure):\n" + entry(*root))


def collect(tmp_path, root, other):
    recorded = BenchResult.failure(SPEC, status="oom", run_id="r", failed_rank=1,
                                   error="rank 1: OutOfMemoryError: injected")
    (tmp_path / "result.json").write_text(recorded.dumps())
    (tmp_path / "torchrun.log").write_text(torchrun_log(root, other))
    return _collect(SPEC, tmp_path, "r", rc=1, status="finished", reason="")


def test_the_rank_that_recorded_first_is_kept_when_torchrun_ties_to_another(tmp_path):
    result = collect(tmp_path, root=(0, 1), other=(1, 1))
    assert (result.status, result.failed_rank) == ("oom", 1)
    assert result.error == "rank 1: OutOfMemoryError: injected"


def test_a_rank_that_died_without_recording_is_the_cause(tmp_path):
    result = collect(tmp_path, root=(1, 1), other=(0, 3))
    assert result.failed_rank == 0
    assert result.error.startswith("rank 0 died (exit code 3) without recording a failure; then rank 1")


def test_ranks_torchrun_stopped_after_the_failure_are_not_blamed(tmp_path):
    result = collect(tmp_path, root=(0, -15), other=(1, 1))
    assert result.failed_rank == 1 and result.error.startswith("rank 1: OutOfMemoryError")
