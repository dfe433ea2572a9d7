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

from harness import metrics
from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench import ab, launchers, trials
from pytest_llmbench.budget import Budget
from pytest_llmbench.launchers import LauncherKind
from pytest_llmbench.profiles import Profile
from pytest_llmbench.settings import Settings
from pytest_llmbench.store import ResultStore, latest_per_trial, launcher_of

SESSION_KEY = pytest.StashKey["BenchSession"]()


@dataclass
class BenchSession:
    settings: Settings
    profiles: dict[str, Profile]
    store: ResultStore
    records: list[tuple[str, BenchResult]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cases: list = field(default_factory=list)  # the whole matrix, built once at configure
    host_gpus: list[str] = field(default_factory=list)  # this host's GPU names (cases.local_gpus)
    unsaved: dict[str, str] = field(default_factory=dict)  # run id -> why its result was not stored
    baseline_last: set[tuple[str, int]] = field(default_factory=set)  # (group, trial): cases.baseline_last
    budget: Budget = field(default_factory=Budget)  # the session's gates and their shares (budget.py)
    # --llmbench-ab: the two sides (ab.py), the baseline side's results, each case's A/B verdicts and notes
    sides: dict = field(default_factory=dict)
    side_records: list[tuple[str, BenchResult]] = field(default_factory=list)
    ab_verdicts: dict = field(default_factory=dict)
    ab_notes: dict[str, list[str]] = field(default_factory=dict)
    ab_first: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # the suite test's rounds
    _compared: list[tuple[str, BenchResult]] | None = None
    compared_skipped: list[tuple[Path, str]] = field(default_factory=list)  # its files that could not be read

    @classmethod
    def create(cls, settings: Settings, profiles: dict[str, Profile]) -> BenchSession:
        return cls(settings=settings, profiles=profiles, store=ResultStore(settings.output))

    @property
    def launcher(self) -> LauncherKind:
        """The launcher this session runs its cases with (--llmbench-launcher)."""
        return launchers.get(self.settings.launcher)

    @property
    def output(self) -> Path:
        return Path(self.settings.output)

    def record(self, profile: str, result: BenchResult) -> Path | None:
        """Keep the result and write it to the store at once (nothing measured is lost). A write
        that fails (a full disk, an I/O error) is remembered (``unsaved``) and said in the summary;
        the test of the case fails on it (runner.Runner.check), the results before it stay."""
        self.records.append((profile, result))
        try:
            return self.store.save(result, profile=profile)
        except OSError as exc:
            why = f"{profile}-{result.case_id}: measured but not stored under {self.store.session_dir}: {exc}"
            self.unsaved[result.run_id] = why
            self.notes.append(why)
            return None

    def record_side(self, profile: str, result: BenchResult) -> None:
        """Keep and store a result of the A/B baseline side, apart from the session's own cases (its
        folder ``ab-baseline`` in the session: never a trial of the candidate's case)."""
        self.side_records.append((profile, result))
        try:
            self.store.save_side(result, profile=profile, facts_json=ab.facts_json(self.sides))
        except OSError as exc:
            self.notes.append(f"{profile}-{result.case_id}: baseline side measured but not stored: {exc}")

    def side_trials(self, profile: str, case_id: str) -> list[BenchResult]:
        """The A/B baseline side's rounds of a case, the latest launch of each, in round order."""
        return latest_per_trial([r for prof, r in self.side_records
                                 if prof == profile and r.case_id == case_id])

    def replace(self, profile: str, result: BenchResult) -> None:
        """Put ``result`` in place of the recorded result with its run id (a scaled case whose
        efficiency became known when its round's baseline ran after it) and store it again."""
        self.records = [(p, result if r.run_id == result.run_id else r) for p, r in self.records]
        try:
            self.store.save(result, profile=profile)
        except OSError as exc:
            self.notes.append(f"{profile}-{result.case_id}: its efficiency was not stored: {exc}")

    def find_baseline(self, profile: str, spec: RunSpec, world_size: int, *, trial: int = 1,
                      any_trial: bool = True) -> BenchResult | None:
        """The latest ok result of the same case at ``world_size`` and the same trial in this
        session; with ``any_trial`` also of another trial, then from the store (run by the same
        launcher: a local run on a login node is no baseline for a Slurm job)."""
        group = spec.scaling_identity()

        def latest(source: list[tuple[str, BenchResult]], trials: bool) -> BenchResult | None:
            return next((result for prof, result in reversed(source)
                         if prof == profile and result.ok and result.spec.world_size == world_size
                         and (trials or result.trial == trial)
                         and launcher_of(result) == getattr(self.settings, "launcher", "local")
                         and result.spec.scaling_identity() == group), None)

        found = latest(self.records, trials=False)
        if found is None and any_trial:  # the store is read only if needed
            found = latest(self.records, trials=True) or latest(self.store.load_all(), trials=True)
        return found

    def trials_of(self, profile: str, case_id: str) -> list[BenchResult]:
        """This session's trials of a case, the latest launch of each trial index, in trial order."""
        return latest_per_trial([r for prof, r in self.records if prof == profile and r.case_id == case_id])

    def compared(self, profile: str, case_id: str) -> list[BenchResult]:
        """The trials of the same case in the ``--llmbench-compare`` session, if stored."""
        if self._compared is None:
            session = self.store.resolve_session(self.settings.compare)
            self._compared, self.compared_skipped = self.store.read_session(session)
        return latest_per_trial([r for prof, r in self._compared if prof == profile and r.case_id == case_id])

    def write_report(self) -> None:
        """The report at the session's end, as ``llmbench_session_report`` asks (full, text or none);
        what became of it is a line of the summary."""
        what = self.settings.session_report
        if what == "none":
            self.notes.append(f"report: not written ({self.settings.sources['session_report']} says none); "
                              f"write it with pytest --llmbench-report")
            return
        from pytest_llmbench.report import build_report

        try:
            written = build_report(self.output, echo=lambda _: None, profiles=self.profiles,
                                   draw=what == "full") == 0
            self.notes.append("report: " + (f"written to {self.output / 'report' / 'REPORT.md'}" if written
                                            else "not written") + ("" if what == "full" else " (no plots)"))
        except OSError as exc:  # a full disk or an I/O error: the results stay stored, the summary prints
            self.notes.append(f"report: not written: {exc}; rebuild it with pytest --llmbench-report")

    def summary_lines(self) -> list[str]:
        """A line per finished case: the metric table's ``summary`` columns and the status."""
        several = any(r.trial > 1 for _, r in self.records)
        columns = [(m, *m.summary, max(len(m.summary[0]), 10)) for m in metrics.table() if m.summary]
        header = f"{'case':<32} " + " ".join(f"{title:>{w}}" for _, title, _, w in columns) + "  status"
        lines = [header, "-" * len(header)]
        for profile, r in self.records:
            name = f"{profile}-{r.case_id}" + (f" #{r.trial}" if several else "")
            cells = " ".join(f"{_fmt(r.metrics.get(m.name), spec):>{w}}" for m, _, spec, w in columns)
            lines.append(f"{name:<32} {cells}  {r.status}")
        return lines + (self._trial_lines() if several else [])

    def _trial_lines(self) -> list[str]:
        """Per case, tokens/s over its trials: mean, 95% t-interval of the mean, cv."""
        header = f"{'case':<32} {'trials ok':>9} {'tokens/s mean':>13} {'95% interval':>19} {'cv %':>6}"
        lines = ["", "tokens/s over trials (95% t-interval of the mean of trial means)", header,
                 "-" * len(header)]
        for profile, case_id in dict.fromkeys((p, r.case_id) for p, r in self.records):
            results = self.trials_of(profile, case_id)
            row = trials.summary_row(results)
            interval = (f"{row['low']:.0f}-{row['high']:.0f}" if row["low"] is not None else "-")
            lines.append(f"{profile + '-' + case_id:<32} {row['n']:>4} of {len(results):<2} "
                         f"{_fmt(row['mean'], '.0f'):>13} {interval:>19} "
                         f"{_fmt(row['cv'] and 100 * row['cv'], '.1f'):>6}")
        return lines


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
