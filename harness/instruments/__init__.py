"""In-run instruments: what a run records beyond its measured steps, one protocol, one table.

An instrument runs on every rank after the measured steps (its steps are never measured steps)
and returns a per-rank payload; rank 0 derives its metric-table rows from every rank's payload.

    Instrument row  name (the key in ``RunSpec.instruments`` -> how many steps, and in
                    ``BenchResult.instruments`` -> the per-rank payloads), what it is, its module,
                    the set-up phase it is timed under, the metric rows it derives
    its module      ``record(run: Run) -> payload`` on each rank (JSON-able; an instrument that
                    fails returns ``{"error": why}``: it costs its numbers, never the run's), and
                    with metric rows ``derive(payloads: list) -> {metric: value or None}`` on
                    rank 0 (the payloads of rank 0, 1, ...; [] when the case did not ask for it)

Standard library only: the spec checks names here in the pytest process; a module is imported on
the ranks only. Built-in rows are below, run in this order; a package adds its own through the
entry-point group ``pytest_llmbench.instruments``, or a module named in ``LLMBENCH_INSTRUMENTS``
(comma-separated, also read by every rank), either of which calls ``register``. The always-on
measurements (step times, peak memory, the energy counter over the measured steps, the traffic of
the last warm-up step, the compute-only probe) are the run itself (harness/train.py), not
instruments.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness import metrics, strategies

PLUGIN_ENV = "LLMBENCH_INSTRUMENTS"
ENTRY_POINT_GROUP = "pytest_llmbench.instruments"


class InstrumentError(ValueError):
    """An unknown instrument, a bad step count or a malformed row; the message names it."""


@dataclass(frozen=True)
class Instrument:
    name: str
    doc: str
    module: str  # imported on the ranks: record(run), and derive(payloads) with metric rows
    phase: str = ""  # the result's phases_s key its time goes to; "" = "<name>_s"
    metrics: tuple[str, ...] = ()  # the metric-table rows it derives (harness/metrics.py)

    @property
    def phase_key(self) -> str:
        return self.phase or f"{self.name}_s"


@dataclass(frozen=True)
class Run:
    """What ``record`` gets: the wrapped model after the measured steps, this rank's batches, the case,
    the device, the rank, how many steps it asked for and the case's output folder."""

    engine: Any
    batches: list
    spec: Any
    device: Any
    rank: int
    steps: int
    out_dir: str

    def step_batches(self, count: int) -> list:
        """``count`` steps' micro-batches, cycling this rank's batches."""
        return [self.batches[i % len(self.batches)] for i in range(count)]


BUILTIN: tuple[Instrument, ...] = (
    Instrument("trace", "torch.profiler on every rank after the measured steps: a Chrome trace per "
               "rank and each step's compute, communication, hidden communication and idle time "
               "(--llmbench-trace)",
               "harness.instruments.trace",
               metrics=("trace_exposed_comm", "trace_comm_hidden", "trace_idle")),
    Instrument("memory", "PyTorch's memory trackers on every rank after those: bytes by category at the "
               "peak (--llmbench-memory)", "harness.instruments.memory", phase="memory_tracker_s"),
    Instrument("bookkeeping", "the bytes the strategy's own code moves through memory in a step (copies "
               "into and out of collective buffers, casts, divides), by where and operator",
               "harness.instruments.bookkeeping"),
)
_TABLE: dict[str, Instrument] = {i.name: i for i in BUILTIN}
_plugins_loaded = False


def register(instrument: Instrument, *rows: metrics.Metric) -> Instrument:
    """Add a plugin's instrument and the metric rows it derives on rank 0 (``rows``: their names
    are its ``metrics``); a name already in the table is an error."""
    if instrument.name in _TABLE and _TABLE[instrument.name] != instrument:
        raise InstrumentError(f"instrument {instrument.name!r} is already in the table")
    if sorted(r.name for r in rows) != sorted(instrument.metrics):
        raise InstrumentError(f"instrument {instrument.name!r}: rows {[r.name for r in rows]} are not "
                              f"its metrics {list(instrument.metrics)}")
    for row in rows:
        metrics.register(row, derived_on_rank=True)
    _TABLE[instrument.name] = instrument
    return instrument


def table() -> tuple[Instrument, ...]:
    """Every instrument, in the order a run records them: the built-in ones, then plugins'."""
    _load_plugins()
    return tuple(_TABLE.values())


def get(name: str) -> Instrument:
    _load_plugins()
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise InstrumentError(f"unknown instrument {name!r}; known: {', '.join(_TABLE)}") from None


def phase_key(name: str) -> str:
    """The phases_s key of instrument ``name``, known or not (a stored result outlives plugins)."""
    return _TABLE[name].phase_key if name in _TABLE else f"{name}_s"


def check(asked: Any, *, stored: bool = False) -> dict[str, int]:
    """A spec's ``instruments``: each a known name with a whole number of steps >= 1. ``stored``: the
    spec of a stored result, whose instrument may be a plugin's this process does not have (its name
    and payloads are data then, read as strategies are: harness/spec_checks.reading_stored)."""
    if not isinstance(asked, Mapping):
        raise InstrumentError(f"{asked!r} must be a table of instrument name -> steps")
    for name, steps in asked.items():
        if not (stored and isinstance(name, str) and name):
            get(name)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InstrumentError(f"{name}: {steps!r} steps is not a whole number >= 1")
    return dict(asked)


def record(asked: Mapping[str, int], *, phases: dict[str, float], **run: Any) -> dict[str, Any]:
    """On one rank: each instrument ``asked`` for (in table order), its payload by name; each timed
    into ``phases``. ``run``: Run's fields but ``steps``."""
    payloads = {}
    for instrument in table():
        if instrument.name in asked:
            start = time.perf_counter()
            module = importlib.import_module(instrument.module)
            payloads[instrument.name] = module.record(Run(steps=asked[instrument.name], **run))
            phases[instrument.phase_key] = time.perf_counter() - start
    return payloads


def derive(payloads: Mapping[str, list]) -> dict[str, Any]:
    """On rank 0: every instrument's metric rows from its payloads (rank 0, 1, ...), None where the
    case did not ask for it or it gave nothing."""
    values: dict[str, Any] = {}
    for instrument in table():
        if instrument.metrics:
            module = importlib.import_module(instrument.module)
            found = module.derive(list(payloads.get(instrument.name, [])))
            values.update({name: found.get(name) for name in instrument.metrics})
    return values


def _load_plugins() -> None:
    """Import the modules of ``LLMBENCH_INSTRUMENTS`` and the entry points (once); each registers rows."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    strategies.import_plugins(PLUGIN_ENV, ENTRY_POINT_GROUP, InstrumentError)
