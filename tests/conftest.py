"""Shared by every test folder."""

import pytest


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch):
    """`make test` runs under pytest-xdist. A pytest that a test starts (pytester) must not inherit
    the worker's PYTEST_XDIST_* variables: pytest-benchmark reads PYTEST_XDIST_WORKER as "xdist is
    on" and disables itself, so `--benchmark-json` would write nothing."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
