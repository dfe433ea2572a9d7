"""An option of the plugin: a flag ``--llmbench-<name>``, an ini key ``llmbench_<name>`` and an env
var ``LLMBENCH_<NAME>``, with the parser that checks its value and names where a bad one came from.
The plugin's own options are in settings.py; a launcher declares its own (launchers/)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import metrics
from harness.spec_checks import SpecError, parse_variant


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    parse: Callable[[str, str], Any]  # (raw text, where it came from) -> value
    default: Any = None
    many: bool = False  # repeatable / comma-separated
    short: str | None = None  # the design's short flag, e.g. --strategy
    flag: bool = False  # a switch without a value
    value_name: str | None = None  # how its value is written in --help and the GUIDE (default: NAME)

    @property
    def metavar(self) -> str:
        return self.value_name or self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return "llmbench_" + self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "LLMBENCH_" + self.name.replace("-", "_").upper()


def choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(raw: str, where: str) -> str:
        if raw not in choices:
            raise pytest.UsageError(f"{where}: unknown value {raw!r}; choose from {', '.join(choices)}")
        return raw
    return parse


def positive_int(raw: str, where: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: {raw!r} is not an integer") from None
    if value < 1:
        raise pytest.UsageError(f"{where}: {value} must be >= 1")
    return value


def at_most(top: int):
    """A positive integer no larger than ``top``."""
    def parse(raw: str, where: str) -> int:
        value = positive_int(raw, where)
        if value > top:
            raise pytest.UsageError(f"{where}: {value} is more than {top}")
        return value
    return parse


def variant(raw: str, where: str) -> str:
    try:
        parse_variant(raw)
    except SpecError as exc:
        raise pytest.UsageError(f"{where}: {str(exc).removeprefix('variant: ')}") from None
    return raw


def positive_float(raw: str, where: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise pytest.UsageError(f"{where}: {raw!r} is not a finite number of seconds")
    if value <= 0:
        raise pytest.UsageError(f"{where}: {value} must be > 0")
    return value


def text(raw: str, where: str) -> str:
    return raw


RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def runner_label(raw: str, where: str) -> str:
    """A name for the runner (a CI machine class, a node pool): letters, digits, '.', '_' and '-',
    at most 63 characters; it keys the stored history beside the hardware (report/history.py)."""
    if not RUNNER_LABEL.fullmatch(raw):
        shown = raw if len(raw) <= 80 else raw[:80] + "..."
        raise pytest.UsageError(f"{where}: {shown!r} is not a runner label (letters, digits, '.', '_', '-'; "
                                f"at most 63, starting with a letter or digit)")
    return raw


def existing_file(raw: str, where: str) -> str:
    if not Path(raw).is_file():
        raise pytest.UsageError(f"{where}: profile file {raw!r} does not exist")
    return raw


GATE = re.compile(r"^(?P<metric>[a-z_]+):(?P<pct>\d+(\.\d+)?)%?$")


def gate(raw: str, where: str) -> tuple[str, float]:
    match = GATE.match(raw)
    if not match:
        raise pytest.UsageError(f"{where}: {raw!r} is not METRIC:PCT, e.g. tokens_per_s:5%")
    metric = match["metric"]
    if metric not in metrics.gated():
        raise pytest.UsageError(f"{where}: {metric!r} is not a metric with a better direction; choose from "
                                f"{', '.join(metrics.gated())}")
    return metric, float(match["pct"])


def instrument(raw: str, where: str) -> tuple[str, int]:
    """``NAME`` or ``NAME=STEPS``: an instrument of harness/instruments and its steps (default 1)."""
    from harness import instruments

    name, _, steps = raw.partition("=")
    try:
        return instruments.get(name.strip()).name, positive_int(steps, where) if steps else 1
    except instruments.InstrumentError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None


def checked(check: Callable[[Any], str | None], what: str) -> Callable[[str, str], str]:
    """A value checked by a rule that returns why it is bad (e.g. launchers/k8s/values.py)."""
    def parse(raw: str, where: str) -> str:
        rule = check(raw)
        if rule:
            raise pytest.UsageError(f"{where}: {raw!r} is not a valid {what}: it {rule}")
        return raw
    return parse
