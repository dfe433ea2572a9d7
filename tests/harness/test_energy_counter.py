"""A real 2-rank run reading an energy counter whose readings the test controls: the powercap
tree's ``energy_uj`` is a FIFO that hands rank 0 the next value of a list at each read (when the
counter is opened, just before the first measured step, just after the last). The run's energy is
the difference of the last two, across a wrap-around; rank 1 says why it reads nothing; the
per-token figures follow from it."""

import errno
import os
import threading
import time

import pytest

from harness import energy
from tests.harness.conftest import launch, tiny_spec

TOP = 2**32 - 1  # max_energy_range_uj
READINGS = [123, TOP - 1_000_000, 2_500_000]  # opened; measured steps start; they end (wrapped)


def serve(fifo, values: list[int], stop: threading.Event, served: list[int]) -> None:
    """Write each value to the next reader of ``fifo``, then close it (the reader sees EOF): each
    read of the counter gets one value."""
    for value in values:
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader opens it
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                time.sleep(0.002)
                continue
            with os.fdopen(fd, "w") as out:
                out.write(f"{value}\n")
            served.append(value)
            # the reader closes within microseconds of its EOF; a next reader arriving meanwhile
            # waits in open(). Reopening at once could hand the old reader the next value too.
            time.sleep(0.2)
            break


def test_energy_of_the_measured_steps_from_a_counter_the_test_controls(tmp_path):
    domain = tmp_path / "powercap" / "intel-rapl:0"
    domain.mkdir(parents=True)
    (domain / "max_energy_range_uj").write_text(f"{TOP}\n")
    os.mkfifo(domain / "energy_uj")
    stop, served = threading.Event(), []
    thread = threading.Thread(target=serve, args=(domain / "energy_uj", READINGS, stop, served), daemon=True)
    thread.start()
    try:
        r = launch(tiny_spec(strategy="ddp", compute_probe_steps=0), tmp_path / "run",
                   env={energy.POWERCAP_ENV: str(tmp_path / "powercap")})
    finally:
        stop.set()
        thread.join(timeout=10)
    assert r.ok, r.describe_failure()
    assert served == READINGS  # read exactly three times, all by rank 0
    joules = (READINGS[2] - READINGS[1]) % (TOP + 1) / 1e6  # 3.500001 J across the wrap
    host, other = r.energy_per_rank
    assert host["scope"] == "host" and host["joules"] == pytest.approx(joules) and host["reason"] is None
    assert other["joules"] is None and other["reason"] == "the host's RAPL counter is read by local rank 0"
    tokens = r.spec.tokens_per_step * len(r.step_times_s)
    assert r.metrics["energy_j"] == pytest.approx(joules)
    assert r.metrics["joules_per_token"] == pytest.approx(joules / tokens)
    assert r.metrics["tokens_per_kwh"] == pytest.approx(3.6e6 * tokens / joules)
    assert "1 host(s)' CPU packages" in r.metrics["energy_basis"]
