"""The report's A/B section: each stored A/B session (``--llmbench-ab``), what each side ran and,
per case, its rounds' paired ratio of tokens/s (candidate / baseline) with its 95% interval."""

from __future__ import annotations

import statistics

from pytest_llmbench import stats
from pytest_llmbench.report.sections import Section, Variables, View
from pytest_llmbench.store import ResultStore

METRIC = "tokens_per_s"


def ab_rows(view: View) -> Variables:
    store = ResultStore(view.output)
    sessions, rows = [], []
    for session in view.loaded.sessions or store.sessions():
        stored = store.ab_session(session)
        if stored is None:
            continue
        facts, side = stored
        sides = {name: _facts(facts.get(name)) for name in ("candidate", "baseline")}
        sessions.append({"session": session, **sides})
        rows += _cases(session, store.load_session(session), side)
    return {"ab_sessions": sessions, "ab_rows": rows, "paired_method": stats.PAIRED_ROUNDS_METHOD}


def _facts(side: object) -> str:
    """A side's facts as one line: what it is, its commit, interpreter and versions."""
    if not isinstance(side, dict):
        return "not recorded"
    keys = ("side", "ref", "commit", "python", "torch", "deepspeed", "image", "env")
    return ", ".join(f"{k} {str(side[k])[:40]}" for k in keys if side.get(k) not in (None, "", {}))


def _cases(session: str, candidate: list, baseline: list) -> list[dict]:
    """Per case of the session: rounds, each side's mean, and the rounds' paired ratio with its
    interval, by the gate's own estimator (stats.paired_log_ratios, stats.mean_log_ratio_interval)."""
    def by_case(results) -> dict[tuple[str, str], dict[int, float]]:
        out: dict[tuple[str, str], dict[int, float]] = {}
        for profile, result in results:
            value = result.metrics.get(METRIC)
            if result.ok and isinstance(value, (int, float)) and value > 0:
                out.setdefault((profile, result.case_id), {})[result.trial] = value
        return out

    candidates, baselines = by_case(candidate), by_case(baseline)
    rows = []
    for key in sorted(candidates.keys() & baselines.keys()):
        rounds = sorted(candidates[key].keys() & baselines[key].keys())
        pairs = [(candidates[key][r], baselines[key][r]) for r in rounds]
        if not pairs:
            continue
        logs = stats.paired_log_ratios(pairs)
        ratio = stats.mean_log_ratio_interval(logs)
        rows.append({"session": session, "case": f"{key[0]}-{key[1]}", "rounds": len(pairs),
                     "candidate": f"{statistics.fmean(a for a, _ in pairs):,.0f}",
                     "baseline": f"{statistics.fmean(b for _, b in pairs):,.0f}",
                     "ratio": f"{ratio.value:.3f}" + (f" ({ratio.low:.3f} to {ratio.high:.3f})"
                                                      if ratio.low is not None else ""),
                     "sd": f"{statistics.stdev(logs):.3f}" if len(logs) > 1 else "-"})
    return rows


SECTIONS = (Section("ab", ab_rows),)
