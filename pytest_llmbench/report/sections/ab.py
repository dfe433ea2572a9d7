"""The report's A/B section: each stored A/B session (``--llmbench-ab``), what each side ran and,
per case, its rounds' paired ratio of tokens/s (candidate / baseline) with its 95% interval."""

from __future__ import annotations

import json
import math
import statistics

from pytest_llmbench import stats
from pytest_llmbench.report.sections import Section, Variables, View
from pytest_llmbench.store import ResultStore, read_file, result_files

METRIC = "tokens_per_s"


def ab_rows(view: View) -> Variables:
    store = ResultStore(view.output)
    sessions, rows = [], []
    for session in view.loaded.sessions or store.sessions():
        folder = store.results_dir / session
        if not (folder / "ab-baseline").is_dir():
            continue
        try:
            facts = json.loads((folder / "_ab.json").read_text())
        except (OSError, ValueError):
            facts = {}
        sides = {name: _facts(facts.get(name)) for name in ("candidate", "baseline")}
        sessions.append({"session": session, **sides})
        rows += _cases(session, folder)
    return {"ab_sessions": sessions, "ab_rows": rows, "paired_method": stats.PAIRED_METHOD}


def _facts(side: object) -> str:
    """A side's facts as one line: what it is, its commit, interpreter and versions."""
    if not isinstance(side, dict):
        return "not recorded"
    keys = ("side", "ref", "commit", "python", "torch", "deepspeed", "image", "env")
    return ", ".join(f"{k} {str(side[k])[:40]}" for k in keys if side.get(k) not in (None, "", {}))


def _cases(session: str, folder) -> list[dict]:
    """Per case of the session: rounds, each side's mean, the paired ratio with its interval."""
    def by_case(files) -> dict[tuple[str, str], dict[int, float]]:
        out: dict[tuple[str, str], dict[int, float]] = {}
        for path in files:
            try:
                profile, result = read_file(path)
            except ValueError:
                continue
            value = result.metrics.get(METRIC)
            if result.ok and isinstance(value, (int, float)) and value > 0:
                out.setdefault((profile, result.case_id), {})[result.trial] = value
        return out

    candidates, baselines = by_case(result_files(folder)), by_case(result_files(folder / "ab-baseline"))
    rows = []
    for key in sorted(candidates.keys() & baselines.keys()):
        rounds = sorted(candidates[key].keys() & baselines[key].keys())
        pairs = [(candidates[key][r], baselines[key][r]) for r in rounds]
        if not pairs:
            continue
        ratio = stats.paired_ratio_interval(pairs)
        logs = [math.log(a / b) for a, b in pairs]
        rows.append({"session": session, "case": f"{key[0]}-{key[1]}", "rounds": len(pairs),
                     "candidate": f"{statistics.fmean(a for a, _ in pairs):,.0f}",
                     "baseline": f"{statistics.fmean(b for _, b in pairs):,.0f}",
                     "ratio": f"{ratio.value:.3f}" + (f" ({ratio.low:.3f} to {ratio.high:.3f})"
                                                      if ratio.low is not None else ""),
                     "sd": f"{statistics.stdev(logs):.3f}" if len(logs) > 1 else "-"})
    return rows


SECTIONS = (Section("ab", ab_rows),)
