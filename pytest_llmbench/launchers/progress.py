"""Which ranks were still making progress: from the step lines every rank prints.

Rank 0 prints ``llmbench train step 3/20 ...`` (the line users see), rank R > 0 prints
``llmbench[R] train step 3/20 ...``. A rank is making progress when it printed a new step
line within the stall window: ten seconds, or three times the longest gap between its step
lines seen so far, whichever is longer. Launchers feed what they read from the logs and,
when a case times out, put ``summary()`` in its error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

STEP_LINE = re.compile(r"^llmbench(?:\[(?P<rank>\d+)\])? (?P<what>[\w-]+ step \d+/\d+)", re.MULTILINE)
MIN_STALL_S = 10.0


def last_progress_line(log: str) -> str:
    """Rank 0's last progress line without its prefix (what users see), or ""."""
    lines = [ln for ln in log.splitlines() if ln.startswith("llmbench ")]
    return lines[-1].removeprefix("llmbench ") if lines else ""


def last_steps(log: str, default_rank: int | None = None) -> dict[int, str]:
    """{rank: its last step, e.g. 'train step 3/20'} from a log holding one or more ranks' lines.
    ``default_rank``: the rank of unprefixed lines when the log is one rank's own (local)."""
    steps: dict[int, str] = {}
    for match in STEP_LINE.finditer(log):
        rank = int(match["rank"]) if match["rank"] else (0 if default_rank is None else default_rank)
        steps[rank] = match["what"]
    return steps


class RankProgress:
    """When each rank's last step line first appeared (launcher clock)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[str, float]] = {}
        self.longest_gap: dict[int, float] = {}

    def update(self, steps: dict[int, str], now: float) -> None:
        for rank, step in steps.items():
            before = self.last.get(rank)
            if before is None or before[0] != step:
                if before is not None:
                    self.longest_gap[rank] = max(self.longest_gap.get(rank, 0.0), now - before[1])
                self.last[rank] = (step, now)

    def making_progress(self, rank: int, now: float) -> bool:
        if rank not in self.last:
            return False
        window = max(MIN_STALL_S, 3 * self.longest_gap.get(rank, 0.0))
        return now - self.last[rank][1] <= window

    def summary(self, ranks: range | list[int], now: float, facts: dict[int, str] | None = None) -> str:
        """'making progress: rank 0 (train step 7/20, 0.4 s ago); not: rank 1 (no step line yet; ...)'"""
        facts = facts or {}
        going, stuck = [], []
        for rank in ranks:
            if rank in self.last:
                step, since = self.last[rank]
                words = f"{step}, {now - since:.1f} s ago"
            else:
                words = "no step line yet"
            if rank in facts:
                words += f"; {facts[rank]}"
            (going if self.making_progress(rank, now) else stuck).append(f"rank {rank} ({words})")
        return (f"ranks making progress: {', '.join(going) or 'none'}; "
                f"not making progress: {', '.join(stuck) or 'none'}")


class ProgressFeed:
    """What a launcher's poll does with the rank logs it read: every rank's last step into
    ``ranks`` (RankProgress) and rank 0's progress line to ``progress`` when it changed."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress, self.ranks, self.last_line = progress, RankProgress(), ""

    def take(self, logs: dict[int, str]) -> None:
        """``logs``: {rank: its own lines} (unprefixed lines are that rank's)."""
        for rank, text in logs.items():
            self.ranks.update(last_steps(text, default_rank=rank), time.monotonic())
        line = last_progress_line(logs.get(0, ""))
        if line and line != self.last_line:
            self.progress(line)
            self.last_line = line
