"""Trials -> cases: one row per trial becomes one row per case, with the spread over trials.

A case row's metrics are the MEAN over its ok trials (tokens/s, step times, memory, MFU,
cost, ...). Beside them, ``case_*`` columns give what the trials add: how many ran and
finished, and for tokens/s the median, the 95% t-interval of the mean and the coefficient
of variation across trials (stats.summary). Scaling efficiency of a case is the ratio of
mean tokens/s at N to N / N0 x mean tokens/s at N0, with the interval of stats.ratio_interval
over the trials of both world sizes (stats.RATIO_METHOD). A trial's own efficiency divides by
the baseline's trial of the same index (run in the same round), else by the baseline's mean.

With one trial a case row is that trial's row and every interval is empty.
"""

from __future__ import annotations

import pandas as pd

from harness import metrics
from harness.derive_after import scaling_efficiency
from harness.result import BenchResult
from pytest_llmbench import stats, trials

CASE_COLUMNS = ["case_trials", "case_trials_ok", "case_tokens_per_s_mean", "case_tokens_per_s_median",
                "case_tokens_per_s_ci_low", "case_tokens_per_s_ci_high", "case_tokens_per_s_cv",
                "case_scaling_efficiency", "case_scaling_efficiency_ci_low",
                "case_scaling_efficiency_ci_high"]
# Cases that share a scaling baseline: the same RunSpec.scaling_identity on the same device (load.py).
GROUP = ["profile", "scaling_key"]


def cases(trial_frame: pd.DataFrame, results: dict[str, BenchResult]) -> pd.DataFrame:
    """One row per case (``case_key``) from its trial rows."""
    rows = []
    for _, g in trial_frame.groupby(["profile", "case_key"], sort=False):
        ok = g[g.status == "ok"]
        row = (ok if not ok.empty else g).sort_values("created_utc").iloc[-1].to_dict()  # the latest
        if len(ok) > 1:
            row.update({m: pd.to_numeric(ok[m], errors="coerce").mean()
                        for m in metrics.names(trials=metrics.MEAN)})
        tps = trials.summary_row([results[rid] for rid in ok.run_id])
        row.update(status="ok" if not ok.empty else row["status"], trial=None, case_trials=len(g),
                   case_trials_ok=len(ok), case_tokens_per_s_mean=tps["mean"],
                   case_tokens_per_s_median=tps["median"], case_tokens_per_s_ci_low=tps["low"],
                   case_tokens_per_s_ci_high=tps["high"], case_tokens_per_s_cv=tps["cv"],
                   case_scaling_efficiency=None, case_scaling_efficiency_ci_low=None,
                   case_scaling_efficiency_ci_high=None, run_ids=ok.run_id.tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def add_efficiency(frame: pd.DataFrame, results: dict[str, BenchResult], reasons: dict[str, str], *,
                   per_trial: bool) -> None:
    """E(N) = tps(N) / (N / N0 x tps(N0)) with N0 the smallest ok world size of the group, which
    must be the stored results' baseline world size (normally 1). ``per_trial``: ``frame`` holds
    trial rows (each divides by its round's baseline trial); else case rows, with intervals."""
    frame["scaling_efficiency"] = None
    frame["scaling_baseline_world_size"] = None
    for _, group in frame.groupby(GROUP, dropna=False):
        wanted = {results[rid].metrics.get("scaling_baseline_world_size") for rid in group.run_id}
        n0 = min((w for w in wanted if w), default=1)
        base = group[(group.status == "ok") & (group.world_size == n0)]
        for idx, row in group.iterrows():
            if row.status != "ok":
                reasons[row.run_id] = f"case did not finish ({row.status})"
            elif base.empty:
                reasons[row.run_id] = (f"no successful ws{n0} baseline of this case in the results; "
                                       f"never assumed 100%")
            elif per_trial:
                same = base[base.trial == row.trial]
                base_tps = (same if not same.empty else base).tokens_per_s.astype(float).mean()
                frame.loc[idx, ["scaling_efficiency", "scaling_baseline_world_size"]] = [scaling_efficiency(
                    tokens_per_s=row.tokens_per_s, world_size=row.world_size,
                    baseline_tokens_per_s=base_tps, baseline_world_size=n0), n0]
            else:
                _case_efficiency(frame, idx, row, base.iloc[0], results, n0)


def _case_efficiency(frame: pd.DataFrame, idx, row, base, results: dict[str, BenchResult], n0: int) -> None:
    if row.world_size == n0:  # E(N0) = 1 by definition, no interval
        e = stats.Ratio(1.0, None, None, "")
    else:
        e = trials.efficiency([results[rid] for rid in row.run_ids], [results[rid] for rid in base.run_ids])
    frame.loc[idx, ["scaling_efficiency", "case_scaling_efficiency", "scaling_baseline_world_size",
                    "case_scaling_efficiency_ci_low", "case_scaling_efficiency_ci_high"]] = [
        e.value, e.value, n0, e.low, e.high]


def add_trial_lists(frame: pd.DataFrame, trial_frame: pd.DataFrame) -> None:
    """``trials_<metric>``: each case row's per-trial values (ok trials) of the metrics the winners
    table ranks."""
    ok = trial_frame[trial_frame.status == "ok"]
    for metric in [m.name for m in metrics.winners()]:
        lists = ok.groupby(["profile", "case_key"])[metric].agg(
            lambda v: pd.to_numeric(v, errors="coerce").dropna().tolist())
        frame[f"trials_{metric}"] = [lists.get((p, k), []) for p, k in zip(frame.profile, frame.case_key,
                                                                           strict=True)]
    slots = trial_frame.groupby(["profile", "case_key"])["launch_slot"].mean()
    frame["case_mean_slot"] = [slots.get((p, k)) for p, k in zip(frame.profile, frame.case_key, strict=True)]
