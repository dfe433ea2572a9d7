"""A real two-node Slurm cluster on this host for the Slurm launcher's tests (tools/slurm_local.py):
munge, slurmctld and two slurmd (n1, n2, two CPUs each), started once per test session and
stopped by their PIDs. Where the daemons are not installed the tests skip with the reason;
under CI (``CI`` set) they fail instead: .ci/run installs slurm-wlm and munge.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.launchers.slurm.launcher import Placement, SlurmLauncher
from tests.procs import MARK, no_process_outlives_its_test  # noqa: F401 - autouse, every test

ROOT = Path(__file__).parents[2]
TINY = dict(micro_batch=4, grad_accum=2, seq_len=64, steps=5, warmup_steps=2, threads_per_rank=1,
            compute_probe_steps=2, lr=3e-3, data_pool=16)


def _tool():
    spec = importlib.util.spec_from_file_location("slurm_local", ROOT / "tools" / "slurm_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slurm_local = _tool()


def two_node_spec(**changes) -> RunSpec:
    """2 ranks on 2 Slurm nodes, one rank each."""
    return RunSpec.from_preset("tiny", **{**TINY, "world_size": 2, "nnodes": 2, **changes})


def squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line.strip()]


def launch(tmp_path, spec=None, *, env=None, timeout_s=90, placement=None, progress=None, name="run"):
    launcher = SlurmLauncher(placement or Placement(), poll_s=0.2)
    return launcher.run(spec or two_node_spec(), run_dir=tmp_path / name, run_id=f"slurm-{name}-abc123",
                        timeout_s=timeout_s, env={"DS_ACCELERATOR": "cpu", **(env or {})},
                        progress=progress or (lambda line: None))


class OneMinute(Placement):
    """Slurm's time limit at one minute, whatever the case's timeout: shorter than the launcher's."""

    def time_limit_min(self, timeout_s: float) -> int:
        return 1


class TimeLimitCase:
    """A hung case that Slurm must kill at its one-minute time limit (the launcher's own timeout,
    150 s, is longer). Slurm checks limits every 30 s or so, so this takes 60-90 s: it runs in
    the background from the cluster's start, beside the other tests (it holds one CPU of a node).

    It runs in a Python process of its own, started before any test's process mark is set: the
    launcher's scontrol and squeue polls inherit the environment of the process that starts them,
    and in this one a test's mark would make them that test's leaks (tests/procs.py)."""

    def __init__(self, root: Path) -> None:
        self.root, self.result = root, None
        root.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k != MARK}
        code = ("import sys, pathlib, tests.slurm.conftest as c; "
                "c.run_time_limit_case(pathlib.Path(sys.argv[1]))")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=(root / "case.err").open("w"))

    def join(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return
        found = self.root / "result.json"
        if found.exists():
            self.result = BenchResult.loads(found.read_text())

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.is_alive():
            self.proc.kill()
            self.proc.wait()


def run_time_limit_case(root: Path) -> None:
    """TimeLimitCase's process: the hung case through the launcher, its result to result.json."""
    spec = RunSpec.from_preset("tiny", **{**TINY, "world_size": 1, "nnodes": 1})
    result = SlurmLauncher(OneMinute(), poll_s=0.5).run(
        spec, run_dir=root / "run", run_id="slurm-time-limit-abc123", timeout_s=150,
        env={"DS_ACCELERATOR": "cpu", "LLMBENCH_FAULT": "0:hang"}, progress=lambda line: None)
    (root / "result.json").write_text(result.dumps())


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    problem = slurm_local.missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests: {problem}")
        pytest.skip(f"no local Slurm cluster: {problem}")
    root = tmp_path_factory.mktemp("slurm")
    os.environ.pop(MARK, None)  # the daemons belong to the session, not to the first test
    cluster = slurm_local.LocalCluster(root / "cluster").start()
    previous = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env)
    os.environ.pop("SLURM_JOB_ID", None)
    timed = TimeLimitCase(root / "time-limit")
    cluster.time_limit_case = timed
    try:
        yield cluster
    finally:
        timed.join(timeout=180)
        timed.stop()
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture
def cluster(slurm_cluster):
    """The session's cluster; after the test nothing of it is left in squeue but the time-limit
    case that runs beside the tests."""
    yield slurm_cluster
    left = [line for line in squeue() if "slurm-time-limit" not in line]
    assert left == [], f"left in squeue after the test: {left}"
