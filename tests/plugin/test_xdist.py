"""Never two measured cases at once on one host: under pytest-xdist, and across processes."""

import subprocess
import sys
import time

import pytest

from pytest_llmbench import hostlock


def test_xdist_workers_measure_their_cases_one_after_the_other(suite):
    """Two cases on two xdist workers: the second is launched only after the first is done."""
    result = suite.runpytest_subprocess(
        "-n", "2", "-v", "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp,fsdp",
        "--world-size=1", "--llmbench-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*llmbench: pytest-xdist: benchmark cases take the host lock one at "
                                 "a time*"])
    # each run folder: spec.json written at launch, result.json by rank 0 at the end
    runs = list((suite.path / "out" / "runs").iterdir())
    starts = sorted((run / "spec.json").stat().st_mtime_ns for run in runs)
    ends = sorted((run / "result.json").stat().st_mtime_ns for run in runs)
    assert len(starts) == 2
    assert starts[1] >= ends[0], (starts, ends)  # the second was launched after the first had its result


HOLD = """
import sys, time
from pathlib import Path
from pytest_llmbench import hostlock
folder = Path(sys.argv[1])
with hostlock.exclusive("case-a", say=print, path=folder / "host.lock"):
    (folder / "held").touch()
    time.sleep(1.5)
    (folder / "released").touch()
"""


def test_a_second_process_waits_for_the_host_and_says_who_holds_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "held").exists():
            assert time.monotonic() < deadline and holder.poll() is None, "the holder never took the lock"
            time.sleep(0.02)
        said: list[str] = []
        with hostlock.exclusive("case-b", say=said.append, path=tmp_path / "host.lock", every_s=0.1):
            assert (tmp_path / "released").exists()  # entered only after the holder let go
        expected = f"waiting for the host: case-a (pid {holder.pid}) is being measured"
        assert said and said[0].startswith(expected), said
    finally:
        holder.wait(timeout=30)


def test_trials_under_xdist_are_refused_before_anything_runs(suite):
    """A case's trials must stay in one process (its aggregate, its interleaved order)."""
    result = suite.runpytest_subprocess("-n", "2", "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
                                        "--llmbench-trials=2", "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*command line --llmbench-trials: several trials per case, and "
                                 "pytest-xdist (-n/--dist) would spread*"])


def test_the_host_lock_never_follows_a_symlink_and_keeps_others_modes(tmp_path, suite, monkeypatch):
    """Another user plants a symlink at the lock's path pointing at a file of ours: the lock
    refuses it (a usage error before anything runs; an error if planted mid-session) and the
    file keeps its mode and content."""
    secret = tmp_path / "secret"
    secret.write_text("mine")
    secret.chmod(0o600)
    lock = tmp_path / "pytest-llmbench.lock"
    lock.symlink_to(secret)
    with pytest.raises(hostlock.HostLockError, match="symbolic link; it is never followed"):
        with hostlock.exclusive("case", say=lambda _: None, path=lock):
            pass
    assert oct(secret.stat().st_mode & 0o777) == "0o600" and secret.read_text() == "mine"
    monkeypatch.setenv("LLMBENCH_HOST_LOCK", str(lock))
    result = suite.runpytest_subprocess("-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
                                        "--strategy=ddp", "--world-size=1", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*host lock {lock} is a symbolic link; it is never followed*"])
    assert oct(secret.stat().st_mode & 0o777) == "0o600" and secret.read_text() == "mine"
    plain = tmp_path / "plain.lock"  # a lock this process creates is made 0666 past the umask
    with hostlock.exclusive("case", say=lambda _: None, path=plain):
        assert oct(plain.stat().st_mode & 0o777) == "0o666"
