"""The results store: one JSON file per finished case, written the moment it finishes.

    OUTPUT/results/<session id>/<profile>-<case id>.json   (a BenchResult + profile name)
    OUTPUT/results/<session id>/<profile>-<case id>-trial<k>.json   (its trial k, for k >= 2)
    OUTPUT/results/<session id>/ab-baseline/...            an A/B session's baseline side (round k)
    OUTPUT/results/<session id>/_ab.json                   the facts of both A/B sides
    OUTPUT/results/<session id>/_gates.json                its A/B verdicts (--llmbench-bisect reads them)
    OUTPUT/runs/<run id>/                                   spec.json, logs, result.json

A session id sorts by time (``20261122T154000Z-ab12``), so "last" is the newest folder.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import warnings
from datetime import UTC, datetime
from pathlib import Path

from harness import metrics, strategies
from harness.result import BenchResult, ResultError
from harness.spec_checks import reading_stored
from harness.transport import write_atomic
from harness.untrusted import UntrustedError, read_json

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one folder name: never a path, '..' or absolute


# Beside a session's results: the display facts of the strategies it stored (store.strategy_facts).
FACTS = "_session.facts"  # JSON, named apart from the results (*.json)
AB_SIDE = "ab-baseline"  # an A/B session's baseline side: a folder of the session (ResultStore.save_side)
AB_FACTS = "_ab.json"  # what each A/B side ran
GATES = "_gates.json"  # an A/B session's verdicts (gates.verdicts_json), read by --llmbench-bisect

def output_problem(output: str | Path) -> str | None:
    """Why results cannot be written under ``output``, or None: it must be (or become) a folder
    this process can create files in. Checked before anything runs (plugin.py)."""
    root = Path(output)
    if not root.exists():  # created when the first result is written: its nearest folder must allow it
        parent = next((p for p in root.absolute().parents if p.exists()), Path("/"))
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            return f"{root} does not exist and cannot be created in {parent}"
        return None
    if not root.is_dir():
        return f"{root} exists and is not a folder"
    try:
        tempfile.NamedTemporaryFile(dir=root, prefix=".llmbench-write-check-").close()
    except OSError as exc:
        return f"{root} is not a folder results can be written to: {exc.strerror}"
    return None


def new_session_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


class ResultStore:
    def __init__(self, output: str | Path, session_id: str | None = None) -> None:
        self.root = Path(output)
        self.results_dir = self.root / "results"
        self.session_id = session_id or new_session_id()
        self._earlier: dict[str, list[tuple[str, BenchResult]]] = {}  # finished sessions, read once

    @property
    def session_dir(self) -> Path:
        return self.results_dir / self.session_id

    def save(self, result: BenchResult, *, profile: str, folder: str = "") -> Path:
        """Write the result (an A/B session's baseline side: into its ``folder`` in the session)."""
        trial = f"-trial{result.trial}" if result.trial > 1 else ""
        path = self.session_dir / folder / f"{profile}-{result.case_id}{trial}.json"
        data = result.to_dict()
        data["profile"] = profile
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
        self._record_facts(result)
        return path

    def _record_facts(self, result: BenchResult) -> None:
        """The session's record (FACTS) of the display facts of each strategy it stored and of each
        plugin metric its results carry, so a report rebuilt where the plugin is absent still draws,
        names and tabulates them as this session did."""
        data = read_facts(self.session_dir)  # read once a save
        strategy_table = strategy_facts(self.session_dir, data)
        metric_table = metric_facts(self.session_dir, data)
        row = strategies.find(result.spec.strategy)
        if row is not None:
            strategy_table[row.name] = {"color": row.color, "doc": row.doc}
        for metric in metrics.plugins():
            if metric.name in result.metrics:
                metric_table[metric.name] = {k: getattr(metric, k) for k in METRIC_FACTS}
        facts = {"strategies": strategy_table, "metrics": metric_table}
        try:
            write_atomic(self.session_dir / FACTS, json.dumps(facts, indent=1, sort_keys=True))
        except OSError:
            pass  # display facts, not measurements: the result is stored; a report draws it grey

    def save_side(self, result: BenchResult, *, profile: str, facts_json: str) -> Path:
        """Store a result of an A/B session's baseline side in its own folder (never a trial of the
        candidate's case), and the facts of both sides once (AB_FACTS)."""
        path = self.save(result, profile=profile, folder=AB_SIDE)
        if not (self.session_dir / AB_FACTS).exists():
            write_atomic(self.session_dir / AB_FACTS, facts_json)
        return path

    def save_gates(self, verdicts_json: str) -> None:
        """An A/B session's verdicts (GATES), beside its results."""
        write_atomic(self.session_dir / GATES, verdicts_json)

    def gates(self, session_id: str) -> dict | None:
        """A stored session's A/B verdicts, or None when it has none (or they cannot be read)."""
        try:
            data = read_json(self.results_dir / session_id / GATES, MAX_FILE_BYTES, "the A/B verdicts")
        except UntrustedError:
            return None
        return data if isinstance(data, dict) else None

    def ab_session(self, session_id: str) -> tuple[dict, list[tuple[str, BenchResult]]] | None:
        """(the facts of both sides, the baseline side's results) of a stored A/B session; None for a
        session that ran no A/B. A facts file that cannot be read is {}; a result, skipped."""
        folder = self.results_dir / session_id
        if not (folder / AB_SIDE).is_dir():
            return None
        try:
            facts = read_json(folder / AB_FACTS, MAX_FILE_BYTES, "the A/B sides' facts")
        except UntrustedError:
            facts = {}
        side = [item for path in result_files(folder / AB_SIDE) if (item := load_file(path))]
        return (facts if isinstance(facts, dict) else {}), side

    def sessions(self) -> list[str]:
        if not self.results_dir.is_dir():
            return []
        return sorted(p.name for p in self.results_dir.iterdir() if p.is_dir())

    def load_session(self, session_id: str) -> list[tuple[str, BenchResult]]:
        return self.read_session(session_id)[0]

    def read_session(self, session_id: str) -> tuple[list[tuple[str, BenchResult]], list[tuple[Path, str]]]:
        """(every readable (profile, result) of the session, (file, why) of each it skipped with a
        warning): a gate that finds nothing to compare says which files it could not read."""
        folder = self.results_dir / session_id
        if not folder.is_dir():
            raise FileNotFoundError(f"no stored session {session_id!r} under {self.results_dir}")
        loaded, skipped = [], []
        for path in result_files(folder):
            try:
                loaded.append(read_file(path))
            except ResultError as exc:
                warnings.warn(f"llmbench: skipping stored result {path}: {exc}", stacklevel=2)
                skipped.append((path, str(exc)))
        return loaded, skipped

    def earlier(self) -> dict[str, list[tuple[str, BenchResult]]]:
        """Every stored session but this one, read once: finished results are never rewritten, so the
        gates of every case of a session share one read of the store (new sessions are picked up)."""
        for session_id in self.sessions():
            if session_id != self.session_id and session_id not in self._earlier:
                self._earlier[session_id] = self.load_session(session_id)
        return self._earlier

    def load_all(self) -> list[tuple[str, BenchResult]]:
        return [item for sid in self.sessions() for item in self.load_session(sid)]

    def resolve_session(self, name: str) -> str:
        """A stored session's id; 'last' is the newest stored session other than the current one."""
        if name in ("last", "latest"):
            older = [s for s in self.sessions() if s != self.session_id]
            if not older:
                raise FileNotFoundError(f"no earlier session stored under {self.results_dir}")
            return older[-1]
        if not SESSION_ID.fullmatch(name):
            raise FileNotFoundError(f"{name!r} is not a session id (a folder name under {self.results_dir}, "
                                    f"e.g. 20261122T155221Z-fc65) or 'last'")
        if not (self.results_dir / name).is_dir():
            raise FileNotFoundError(f"no stored session {name!r} under {self.results_dir}")
        return name


MAX_FILE_BYTES = 64 * 2**20  # a result of 100,000 steps is a few MiB; anything larger is not one


def read_file(path: Path) -> tuple[str, BenchResult]:
    """(profile, result) of one stored file, read as untrusted input: bounded in size and nesting,
    UTF-8, finite numbers, every field of its type. ResultError says what is wrong with it."""
    try:
        data = read_json(path, MAX_FILE_BYTES, "a result")
    except UntrustedError as exc:
        raise ResultError(str(exc)) from None
    profile = data.pop("profile", "unknown") if isinstance(data, dict) else "unknown"
    if not isinstance(profile, str):
        raise ResultError(f"profile: {profile!r} is not a string")
    with reading_stored():  # a plugin's strategy stays a name when its package is absent here
        return profile, BenchResult.from_dict(data)


def result_files(folder: Path) -> list[Path]:
    """The stored results of a session folder (not its FACTS)."""
    return [p for p in sorted(folder.glob("*.json")) if not p.name.startswith("_")]


def read_facts(folder: Path) -> dict:
    """A session's FACTS file as read, {} where there is none or it is not a JSON object."""
    try:
        data = read_json(folder / FACTS, MAX_FILE_BYTES, "a session's facts")
    except UntrustedError:
        return {}
    return data if isinstance(data, dict) else {}


def _table(data: dict, key: str) -> dict:
    table = data.get(key)
    return table if isinstance(table, dict) else {}


def strategy_facts(folder: Path, data: dict | None = None) -> dict[str, dict[str, str]]:
    """{strategy: {"color", "doc"}} a session recorded (FACTS, or ``data`` read from it); {} where it
    recorded none or the file is not what the store writes (untrusted input: only string facts are kept)."""
    table = _table(read_facts(folder) if data is None else data, "strategies")
    return {name: {k: v for k, v in facts.items() if k in ("color", "doc") and isinstance(v, str)}
            for name, facts in table.items() if isinstance(name, str) and isinstance(facts, dict)}


# What a session records of a plugin metric: its row less the code that derives it (the value is stored);
# ``column`` was added later (a session before it recorded none: not a column).
METRIC_FACTS = ("unit", "definition", "higher", "trials", "fmt", "winner", "summary", "column")
_METRIC_KINDS = {"unit": str, "definition": str, "trials": str, "higher": (bool, type(None)),
                 "fmt": (str, type(None)), "winner": (str, type(None)), "summary": (list, type(None)),
                 "column": (str, type(None))}


def metric_facts(folder: Path, data: dict | None = None) -> dict[str, dict]:
    """{metric: its row's display facts} a session recorded for its plugin metrics (FACTS, or ``data``
    read from it); rows with a field of the wrong type are dropped (untrusted input)."""
    table = _table(read_facts(folder) if data is None else data, "metrics")
    return {name: row for name, row in table.items() if isinstance(name, str) and isinstance(row, dict)
            and set(METRIC_FACTS) - {"column"} <= set(row) <= set(METRIC_FACTS)
            and all(isinstance(row[k], _METRIC_KINDS[k]) for k in row)}


def load_file(path: Path) -> tuple[str, BenchResult] | None:
    """(profile, result) of one stored file, or None with a warning naming the file."""
    try:
        return read_file(path)
    except ResultError as exc:
        warnings.warn(f"llmbench: skipping stored result {path}: {exc}", stacklevel=2)
        return None


def latest_per_trial(results: list[BenchResult]) -> list[BenchResult]:
    """One result per trial index (the latest created), in trial order."""
    latest: dict[int, BenchResult] = {}
    for result in sorted(results, key=lambda r: r.created_utc):
        latest[result.trial] = result
    return [latest[k] for k in sorted(latest)]


def launcher_of(result: BenchResult) -> str:
    """The launcher that ran a result (results stored before it was recorded ran locally)."""
    return str(result.env.get("launcher") or "local")
