"""BenchResult: the only result type, and its JSON form.

Standard library only. Its metrics are derived in harness/derive.py (the table of them is
harness/metrics.py); it travels between processes as a file or between log markers
(harness/transport.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from harness import metrics
from harness.spec import RunSpec

# 2 added ``trial``, 3 ``checks``, 4 ``collectives``, 5 ``traffic``, 6 ``energy_per_rank``, 7
# ``launch``, 8 ``per_rank``, 9 ``instruments`` (8 kept the trace and memory payloads in per_rank:
# OLD_PER_RANK); older files are read
SCHEMA_VERSION = 9
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # (as trial 1, no checks, no probe rows)
OLD_PER_RANK = {"trace": "trace", "memory_categories": "memory"}  # a per_rank key (8) -> its instrument
STATUSES = ("ok", "oom", "timeout", "error")
GIB = 1024**3
# exit codes of `python -m harness`, as each rank ends
EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT = 0, 1, 2  # RUN_FAILED: the rank recorded its failure
REJECTED = "llmbench harness: invalid input:"  # the line a rank prints before EXIT_BAD_INPUT


class ResultError(ValueError):
    """A stored or transported result cannot be read."""


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    spec: RunSpec
    status: str
    run_id: str = ""
    error: str | None = None  # exception text / reason when status != ok
    failed_rank: int | None = None
    log_tail: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    strategy_config: dict[str, Any] = field(default_factory=dict)  # what the strategy really used
    n_params: int | None = None
    step_times_s: list[float] = field(default_factory=list)  # post-warm-up, max over ranks
    warmup_step_times_s: list[float] = field(default_factory=list)
    compute_only_step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # per step, mean over ranks, all steps
    memory_per_rank: list[dict[str, Any]] = field(default_factory=list)
    # each rank's energy counter over the measured steps: {joules, source, scope, reason} (harness/energy.py)
    energy_per_rank: list[dict[str, Any]] = field(default_factory=list)
    # each rank's own times: {rank, node, step_times_s (measured steps), compute_only_step_times_s}
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    # what each instrument the spec asked for recorded, name -> [rank 0's payload, ...] (harness/instruments)
    instruments: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    null_reasons: dict[str, str] = field(default_factory=dict)  # metric -> why it is empty
    phases_s: dict[str, float] = field(default_factory=dict)  # set-up phases inside the harness
    checks: dict[str, Any] = field(default_factory=dict)  # frozen weights unchanged etc. (harness/checks.py)
    collectives: list[dict[str, Any]] = field(default_factory=list)  # probe rows (harness/collectives.py)
    # every collective of one step, rank 0's: {op, group_size, dtype, bytes, count} (harness/traffic.py)
    traffic: list[dict[str, Any]] = field(default_factory=list)
    traffic_step: int | None = None  # which step (1-based) it was recorded on: the last warm-up step
    wall_time_s: float | None = None  # whole case as seen by the launcher
    # how its ranks started: {"mode": "fresh", "mark"} (one torchrun for this case, its processes'
    # LLMBENCH_RUN_ID) or {"mode": "warm", "pool",
    # "case_index", "pool_start_s"} (ranks that served earlier cases: launchers/local/warm.py);
    # {} not recorded
    launch: dict[str, Any] = field(default_factory=dict)
    trial: int = 1  # which launch of the case this is in its session (1-based; the plugin sets it)
    created_utc: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ResultError(f"status: {self.status!r} is not one of {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def case_id(self) -> str:
        return self.spec.case_id

    def replace(self, **changes: Any) -> BenchResult:
        return dataclasses.replace(self, **changes)

    def describe_failure(self) -> str:
        """One readable paragraph: status, rank, error and the end of the log."""
        where = f" on rank {self.failed_rank}" if self.failed_rank is not None else ""
        text = f"{self.case_id}: status {self.status}{where}: {self.error or 'no error text'}"
        if self.log_tail:
            text += "\n--- log tail ---\n" + self.log_tail
        return text

    # ---- JSON -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["spec"] = self.spec.to_dict()
        data["case_id"] = self.case_id
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        if not isinstance(data, dict):
            raise ResultError("a result must be a JSON object")
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ResultError(f"schema_version {version!r} is not supported (this version reads "
                              f"{', '.join(map(str, READABLE_VERSIONS))}); re-run the case or use a "
                              f"matching pytest-llmbench")
        data = dict(data, schema_version=SCHEMA_VERSION)  # older files lack only fields with defaults
        data.pop("case_id", None)
        if version == 8:
            _lift_instruments(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ResultError(f"unknown result field(s): {', '.join(unknown)}")
        problem = _type_problem(data)
        if problem:
            raise ResultError(f"malformed result: {problem}")
        try:
            data["spec"] = RunSpec.from_dict(data["spec"])
            return cls(**data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultError(f"malformed result: {exc}") from None

    @classmethod
    def loads(cls, text: str) -> BenchResult:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ResultError(f"not valid JSON: {exc}") from None

    @classmethod
    def failure(cls, spec: RunSpec, *, status: str, error: str, **fields: Any) -> BenchResult:
        """A result for a run that did not finish; nothing measured is invented."""
        null = {"*": f"run ended with status {status}"}
        return cls(spec=spec, status=status, error=error, null_reasons=null, **fields)


_TEXT, _OPT_TEXT = (str,), (str, type(None))
_OPT_INT, _OPT_NUMBER = (int, type(None)), (int, float, type(None))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": _TEXT, "error": _OPT_TEXT, "log_tail": _OPT_TEXT, "created_utc": _TEXT, "failed_rank": _OPT_INT,
    "n_params": _OPT_INT, "traffic_step": _OPT_INT, "wall_time_s": _OPT_NUMBER, "trial": (int,),
    "spec": (dict,),
    **dict.fromkeys(("env", "strategy_config", "metrics", "null_reasons", "phases_s", "checks", "launch",
                     "instruments"),
                    (dict,)),
    **dict.fromkeys(("step_times_s", "warmup_step_times_s", "compute_only_step_times_s", "losses",
                     "memory_per_rank", "energy_per_rank", "per_rank", "collectives", "traffic"), (list,)),
}
_NUMBER_LISTS = ("step_times_s", "warmup_step_times_s", "compute_only_step_times_s", "losses")


def _type_problem(data: dict[str, Any]) -> str | None:
    """What in a stored result is not of its field's type (a stored file is untrusted input), or
    None: every metric a scalar and every number finite, the step times and losses numbers, the
    per-rank memory and probe rows objects."""
    for name, kinds in _FIELD_TYPES.items():
        value = data.get(name)
        if name in data and (not isinstance(value, kinds) or isinstance(value, bool)):
            return f"{name}: {type(value).__name__} where {' or '.join(k.__name__ for k in kinds)} belongs"
    for name, value in data.get("metrics", {}).items():
        if not isinstance(value, (str, int, float, type(None))) or not _finite(value):
            return (f"metrics.{name}: {value!r} is not a finite number within "
                    f"{MAX_STORED_MAGNITUDE:g}, text or null")
        if isinstance(value, str) and name not in metrics.TEXT:  # the report computes with it
            return f"metrics.{name}: {value!r} is text where a number or null belongs"
    for name in _NUMBER_LISTS:
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)
                   for v in data.get(name, [])):
            return f"{name}: not a list of finite numbers"
    for name in ("memory_per_rank", "per_rank", "collectives", "traffic"):
        if not all(isinstance(row, dict) for row in data.get(name, [])):
            return f"{name}: not a list of objects"
    for i, row in enumerate(data.get("per_rank", [])):
        for name in ("step_times_s", "compute_only_step_times_s"):
            times = row.get(name, [])
            if not isinstance(times, list) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v) for v in times):
                return f"per_rank[{i}].{name}: not a list of finite numbers"
    for name, payloads in data.get("instruments", {}).items():
        if not isinstance(payloads, list):
            return f"instruments.{name}: {type(payloads).__name__} where a list of per-rank payloads belongs"
    if "trial" in data and data["trial"] < 1:
        return f"trial: {data['trial']} is below 1"
    return None


def _lift_instruments(data: dict[str, Any]) -> None:
    """Schema 8 kept the trace and memory payloads in each per_rank row: move them to ``instruments``."""
    rows = data.get("per_rank")
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return  # _type_problem names it
    for key, name in OLD_PER_RANK.items():
        if any(key in row for row in rows):
            data.setdefault("instruments", {})[name] = [row.get(key) for row in rows]
    data["per_rank"] = [{k: v for k, v in row.items() if k not in OLD_PER_RANK} for row in rows]


# The largest magnitude a stored number may have: past any measurement (1e30 FLOP, bytes or tokens/s),
# and far enough below float's 1.8e308 that sums, squares and means of a million of them stay finite
# (two stored tokens_per_s of 1.7e308 overflowed statistics.fmean in the report, history and gate).
MAX_STORED_MAGNITUDE = 1e30


def _finite(value: Any) -> bool:
    """A stored number the report can compute with: finite and within MAX_STORED_MAGNITUDE."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return not isinstance(value, (int, float)) or abs(value) <= MAX_STORED_MAGNITUDE

