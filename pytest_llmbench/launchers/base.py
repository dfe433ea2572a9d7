"""What every launcher provides: run one spec, always return a BenchResult."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from harness.result import BenchResult
from harness.spec import RunSpec

Progress = Callable[[str], None]
LOG_TAIL_LINES = 40


class Launcher(Protocol):
    def run(self, spec: RunSpec, *, run_dir: Path, run_id: str, timeout_s: float,
            env: dict[str, str], progress: Progress, placement: dict | None = None,
            placement_source: str = "profile") -> BenchResult:
        """Run the case to the end. A crash, OOM, hang or lost pod is a result, not an exception."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a case: the ranks were stopped; ``result`` records the case."""

    def __init__(self, result: BenchResult) -> None:
        super().__init__("interrupted")
        self.result = result


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
