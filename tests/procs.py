"""No process a test starts may outlive it.

Each test of tests/harness, tests/k8s and tests/plugin runs with a mark of its own in the
environment, which every process it starts inherits (torchrun, ranks, pytester's pytest, the
fake cluster's pods). After the test, a process still carrying the mark is a leak: it is
killed, and the test errors with its command line. Import the fixture into a conftest.
"""

from __future__ import annotations

import time
import uuid

import pytest

from pytest_llmbench.launchers import procs

MARK = "LLMBENCH_TEST_PROCESS_MARK"
SETTLE_S = 10.0  # a SIGKILLed torchrun's ranks get their parent-death signal asynchronously


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(monkeypatch):
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    yield
    deadline = time.monotonic() + SETTLE_S
    while procs.find(MARK, mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = procs.end_all(MARK, mark)
    if leftovers:
        pytest.fail(f"{len(leftovers)} process(es) outlived the test: "
                    + "; ".join(procs.describe(p) for p in leftovers), pytrace=False)
