"""BenchSession: the state of one pytest session (kept in ``config.stash``).

It owns the results store, remembers every case finished in this session, finds
baselines for scaling efficiency, loads the ``--llmbench-compare`` run and prints the
terminal summary.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.profiles import Profile
from pytest_llmbench.settings import Settings
from pytest_llmbench.store import ResultStore

SESSION_KEY = pytest.StashKey["BenchSession"]()

# Spec fields that may differ between a case and its scaling baseline.
_SCALING_FREE = {"world_size", "nnodes", "threads_per_rank", "extra"}


@dataclass
class BenchSession:
    settings: Settings
    profiles: dict[str, Profile]
    store: ResultStore
    records: list[tuple[str, BenchResult]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cases: list = field(default_factory=list)  # the whole matrix, built once at configure
    host_gpus: list[str] = field(default_factory=list)  # this host's GPU names (cases.local_gpus)
    _compared: list[tuple[str, BenchResult]] | None = None

    @classmethod
    def create(cls, settings: Settings, profiles: dict[str, Profile]) -> BenchSession:
        return cls(settings=settings, profiles=profiles, store=ResultStore(settings.output))

    @property
    def output(self) -> Path:
        return Path(self.settings.output)

    def record(self, profile: str, result: BenchResult) -> Path:
        """Keep the result and write it to the store at once (nothing measured is lost)."""
        self.records.append((profile, result))
        return self.store.save(result, profile=profile)

    def find_baseline(self, profile: str, spec: RunSpec, world_size: int) -> BenchResult | None:
        """The latest ok result of the same case at ``world_size``: this session first, then the store."""
        def latest(source: list[tuple[str, BenchResult]]) -> BenchResult | None:
            return next((result for prof, result in reversed(source)
                         if prof == profile and result.ok and result.spec.world_size == world_size
                         and same_case(result.spec, spec)), None)

        return latest(self.records) or latest(self.store.load_all())  # the store is read only if needed

    def compared(self, profile: str, case_id: str) -> BenchResult | None:
        """The same case in the ``--llmbench-compare`` session, if stored."""
        if self._compared is None:
            session = self.store.resolve_session(self.settings.compare)
            self._compared = self.store.load_session(session)
        for prof, result in self._compared:
            if prof == profile and result.case_id == case_id:
                return result
        return None

    def summary_lines(self) -> list[str]:
        header = (f"{'case':<28} {'tokens/s':>10} {'step p50 s':>10} {'peak GiB':>9} "
                  f"{'MFU %':>6} {'eff':>6} {'overhead s':>10}  status")
        lines = [header, "-" * len(header)]
        for profile, r in self.records:
            m = r.metrics
            lines.append(f"{profile + '-' + r.case_id:<28} {_fmt(m.get('tokens_per_s'), '.0f'):>10} "
                         f"{_fmt(m.get('step_time_median_s'), '.4f'):>10} "
                         f"{_fmt(m.get('peak_memory_gib'), '.3f'):>9} "
                         f"{_fmt(m.get('mfu') and 100 * m['mfu'], '.1f'):>6} "
                         f"{_fmt(m.get('scaling_efficiency'), '.2f'):>6} "
                         f"{_fmt(m.get('launch_overhead_s'), '.1f'):>10}  {r.status}")
        return lines


def same_case(a: RunSpec, b: RunSpec) -> bool:
    da, db = a.to_dict(), b.to_dict()
    return all(da[k] == db[k] for k in da if k not in _SCALING_FREE)


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
