"""Shared by every test folder."""

import pytest

# `make test` runs two workers with --dist loadfile: a file's tests stay on one worker, so a module-
# or session-scoped fixture of a file is set up once. These files share the 2-rank runs of
# tests/harness/conftest.py's session fixtures (strategy_results, variant_results,
# workload_results); under plain loadfile each worker that needs a run launches it again (~150 s
# of launches), so they are one unit here. (xdist's loadgroup marks would say the same, but with
# pytest 9.2 and xdist 3.8 they do not group: pytest_llmbench/hostlock.py.)
SHARED_RUNS = {"tests/harness/test_strategies.py", "tests/harness/test_traffic.py",
               "tests/harness/test_variants.py", "tests/harness/test_workloads.py",
               "tests/harness/test_compiled.py"}


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files of SHARED_RUNS scheduled as one file, and tests/k8s's files as
    one (they share one real control plane, ~25 s to start and two cores' worth of processes)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LoadFileSharingRuns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/k8s/"):  # one real control plane for the folder (tests/k8s/conftest.py)
                return "tests/k8s one cluster"
            return "tests/harness/shared runs" if path in SHARED_RUNS else path

    return LoadFileSharingRuns(config, log)


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch):
    """`make test` runs under pytest-xdist. A pytest that a test starts (pytester) must not inherit
    the worker's PYTEST_XDIST_* variables: pytest-benchmark reads PYTEST_XDIST_WORKER as "xdist is
    on" and disables itself, so `--benchmark-json` would write nothing."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _session_reports_without_figures(monkeypatch):
    """A benchmark session a test starts writes its report without plots (matplotlib's 6 of 8 s
    for two cases, ~60 such sessions): tests/unit/test_report.py draws every figure, and the tests that
    read a session's figures ask for them with LLMBENCH_SESSION_REPORT=full."""
    monkeypatch.setenv("LLMBENCH_SESSION_REPORT", "text")
