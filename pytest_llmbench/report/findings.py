"""Winners, recommendations and caveats, computed from the reported rows only.

Whether one case leads another (``lead``): with two or more trials on both sides, only when
the 95% interval of the ratio of their trial means lies wholly beyond 1 +/- stats.NOISE
(stats.compare); with one trial on a side, when the gap exceeds the larger step-time spread
of the two runs (a ranking that rests on one run each, as the caveats say). Peak memory is
nearly the same launch to launch and keeps its fixed tie margin, MEMORY_TIE.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from harness import metrics
from harness.compiled import NOT_COMPILED
from pytest_llmbench import stats
from pytest_llmbench.report.escape import Markdown
from pytest_llmbench.report.escape import code as escape_code
from pytest_llmbench.report.escape import text as md
from pytest_llmbench.report.load import Loaded

NOISY_CV = 0.10  # step-time stddev / mean above which a case is flagged as noisy
# Peak memories closer than this are the same: run-to-run, the same case's peak RSS moved
# by up to 1.1% here (cpu profile, two make-bench runs); 3% leaves room for allocators.
MEMORY_TIE = 0.03
# A rank this much slower than the median rank in its compute-only probe steps (median over steps),
# and slowest in at least STRAGGLER_SHARE of them, is a straggler the caveats name. On this 2-core
# VM, with nothing injected, a make-bench run had 5 of its 25 two-rank cases at 1.11-1.15 (noise of
# a shared host, flagged at 1.10). At two ranks 1.15 is the slower rank 1.35x the faster, about
# nvidia-resiliency-ext's default straggler mark (relative performance score 0.75).
STRAGGLER_RATIO = 1.15
STRAGGLER_SHARE = 0.8


def step_spread(row: Any) -> float:
    """A case's step-time stddev / mean: how far apart its own steps were."""
    mean = float(row.step_time_mean_s)
    return float(row.step_time_stddev_s) / mean if mean > 0 else 0.0


def tie_margin(metric: str, a: Any, b: Any) -> float:
    """Two cases whose ``metric`` differs by less than this (relative) cannot be told apart:
    for time-based metrics, the larger step-time spread of the two; for memory, MEMORY_TIE."""
    return MEMORY_TIE if metric == "peak_memory_gib" else max(step_spread(a), step_spread(b))


def relative_gap(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y)) if max(abs(x), abs(y)) > 0 else 0.0


def trial_values(row: Any, metric: str) -> list[float]:
    values = row.get(f"trials_{metric}") if hasattr(row, "get") else None
    return list(values) if isinstance(values, list) else []


def lead(metric: str, higher: bool, best: Any, second: Any) -> tuple[bool, str, str]:
    """(tie, margin for the winners table, reason for prose) of ``best`` over ``second``."""
    gap = relative_gap(best[metric], second[metric])
    a, b = trial_values(best, metric), trial_values(second, metric)
    if metric != "peak_memory_gib" and len(a) > 1 and len(b) > 1:
        r = stats.ratio_interval(a, b)
        tie = stats.compare(a, b) != ("higher" if higher else "lower")
        why = (("no significant difference: " if tie else "") + f"ratio {r.value:.3f}, 95% interval "
               f"{r.low:.3f}-{r.high:.3f} over {len(a)} vs {len(b)} trials")
        return tie, f"{gap:.1%} ({why})", why
    noise = tie_margin(metric, best, second)
    tie = gap < noise
    return tie, f"{gap:.1%}" + (f" (tie: within {noise:.1%} noise)" if tie else ""), \
        f"within the {noise:.1%} step-time spread"


def superlinear(best: Any, tie: bool, margin: str) -> tuple[bool, str]:
    """A scaling efficiency above 1 wins only where its excess over 1 is outside the case's own noise:
    superlinear scaling of a fixed per-rank batch is noise or a cache effect, not a strategy's gain."""
    value = float(best.scaling_efficiency)
    noise = step_spread(best)
    if value <= 1 or value - 1 > noise:
        return tie, margin
    said = (f"efficiency {value:.2f} is above 1 by less than its {noise:.1%} step-time spread: noise, "
            f"no winner")
    return True, f"{margin}; {said}" if margin else said


def superlinear_caveats(ok: pd.DataFrame) -> list[str]:
    """The finished cases whose scaling efficiency is above 1, named with what that means."""
    above = ok[pd.to_numeric(ok.scaling_efficiency, errors="coerce") > 1]
    if above.empty:
        return []
    names = ", ".join(f"{r.case_id} ({float(r.scaling_efficiency):.2f})" for r in above.itertuples())
    return [f"Scaling efficiency above 1 for {names}: superlinear scaling of a fixed per-rank batch is "
            f"noise or a cache effect (a rank's smaller share of the work fits a faster cache), not a "
            f"strategy's gain; read it as about 1. It wins its category only where it is above 1 by more "
            f"than the case's step-time spread."]


def scope(profile: str, workload: str) -> str:
    """A profile, with its workload when that is not pretraining: strategies are compared within
    one workload (a LoRA run is not a faster pre-training run)."""
    return profile if workload == "pretrain" else f"{profile} ({workload})"


def winners(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (profile, seq_len, world size) and category, the best strategy, the runner-up and
    the margin between them; a margin within the measurement's noise is called a tie."""
    out = []
    ok = frame[frame.status == "ok"]
    for (profile, workload, seq_len, ws), group in ok.groupby(["profile", "workload", "seq_len",
                                                               "world_size"]):
        baseline_ws = ok[(ok.profile == profile) & (ok.seq_len == seq_len)].world_size.min()
        profile = scope(profile, workload)
        for metric, label, higher, fmt in [(m.name, m.winner, m.higher, m.fmt) for m in metrics.winners()]:
            if metric == "scaling_efficiency" and ws == baseline_ws:
                continue  # 1.0 by definition at the baseline: no contest
            values = pd.to_numeric(group[metric], errors="coerce").dropna()
            if values.empty:
                continue
            ranked = group.loc[values.sort_values(ascending=not higher).index]
            best = ranked.iloc[0]
            runner_up, margin, tie = "", "", False
            if len(ranked) > 1:
                second = ranked.iloc[1]
                runner_up = f"{second.strategy} ({fmt.format(second[metric])})"
                tie, margin, _ = lead(metric, higher, best, second)
            if metric == "scaling_efficiency":
                tie, margin = superlinear(best, tie, margin)
            out.append({"profile": profile, "seq_len": seq_len, "world_size": ws, "category": label,
                        "metric": metric, "strategy": best.strategy, "tie": tie,
                        "value": fmt.format(best[metric]), "runner_up": runner_up, "margin": margin})
    return out


def recommendations(frame: pd.DataFrame) -> list[Markdown]:
    """Plain statements a reader can act on, each backed by numbers in the table (markdown: every
    stored name in them escaped)."""
    out = []
    ok = frame[frame.status == "ok"]
    for (profile, workload, seq_len), group in ok.groupby(["profile", "workload", "seq_len"]):
        profile = scope(profile, workload)
        top = group[group.world_size == group.world_size.max()]
        ws = int(top.world_size.iloc[0])
        fast = top.loc[pd.to_numeric(top.tokens_per_s).idxmax()]
        lean = top.loc[pd.to_numeric(top.peak_memory_gib).idxmin()]
        where = md(f"{profile}, seq {seq_len}, {ws} rank(s)")
        slowest = pd.to_numeric(top.tokens_per_s).min()
        text = (f"For throughput ({where}) choose **{md(fast.strategy)}**: "
                f"{fast.tokens_per_s:,.0f} tokens/s, {fast.tokens_per_s / slowest:.2f}x the slowest strategy")
        if len(top) > 1:
            second = top.loc[pd.to_numeric(top.tokens_per_s).nlargest(2).index[1]]
            tie, _, why = lead("tokens_per_s", True, fast, second)
            if tie:
                gap = relative_gap(fast.tokens_per_s, second.tokens_per_s)
                text += (f"; **{md(second.strategy)}** is level with it ({gap:.1%} behind, {why}), "
                         f"so either will do")
        out.append(Markdown(text + "."))
        if lean.strategy != fast.strategy:
            saving = 1 - lean.peak_memory_gib / fast.peak_memory_gib
            cost = 1 - lean.tokens_per_s / fast.tokens_per_s
            if saving < MEMORY_TIE:
                out.append(Markdown(f"Memory does not separate the strategies ({where}): the leanest, "
                                    f"{md(lean.strategy)}, is {saving:.1%} below {md(fast.strategy)}, "
                                    f"within the {MEMORY_TIE:.0%} noise; choose by throughput."))
            else:
                out.append(Markdown(f"If memory is the limit ({where}) choose **{md(lean.strategy)}**: "
                                    f"peak memory {lean.peak_memory_gib:.3f} GiB, {saving:.1%} below "
                                    f"{md(fast.strategy)}, at {cost:.0%} lower throughput."))
        else:
            out.append(Markdown(f"**{md(fast.strategy)}** is both fastest and leanest at {where}: "
                                f"no trade-off to make."))
        eff = pd.to_numeric(top.scaling_efficiency, errors="coerce").dropna()
        if ws > group.world_size.min() and not eff.empty:
            best = top.loc[eff.idxmax()]
            worst = top.loc[eff.idxmin()]
            text = (f"Scaling to {ws} ranks ({md(profile)}, seq {seq_len}) keeps "
                    f"{best.scaling_efficiency:.0%} of linear for {md(best.strategy)}")
            if worst.strategy != best.strategy:
                text += f" and {worst.scaling_efficiency:.0%} for {md(worst.strategy)}"
            out.append(Markdown(text + "."))
    return out


def caveats(loaded: Loaded) -> list[Markdown]:
    """What the reader must know before trusting a number (markdown: every stored string escaped)."""
    frame, out = loaded.frame, []
    for _, row in loaded.trials[loaded.trials.status != "ok"].iterrows():
        trial = f" (trial {row.trial} of {row.case_trials})" if row.case_trials > 1 else ""
        out.append(Markdown(f"Case {md(f'{row.profile}-{row.case_id}')}{trial} ended with status "
                            f"**{md(row.status)}**: {md(row.error or 'no error text')}"))
    single = frame[(frame.status == "ok") & (pd.to_numeric(frame.case_trials_ok) < 2)]
    if not single.empty:
        out.append(f"{len(single)} of {int((frame.status == 'ok').sum())} finished case(s) ran one trial: "
                   f"a ranking that involves them rests on one run each and takes the step-time spread "
                   f"as its noise, which understates how much a case moves from launch to launch; run "
                   f"--llmbench-trials 3 or more for intervals over trials.")
    reasons: Counter[tuple[str, str]] = Counter()
    for result in (loaded.results[rid] for rid in frame.run_id):  # one run per case
        for metric, reason in result.null_reasons.items():
            if metric not in ("scaling_efficiency", "*") and reason != NOT_COMPILED:
                reasons[(metric, reason)] += 1
    for reason in loaded.efficiency_reasons.values():
        reasons[("scaling_efficiency", reason)] += 1
    for (metric, reason), count in sorted(reasons.items()):
        out.append(Markdown(f"`{escape_code(metric)}` is empty for {count} case(s): {md(reason)}."))
    if loaded.sessions:
        out.append(f"Only the results of session(s) {', '.join(loaded.sessions)} are reported, as asked; "
                   f"other stored sessions are left out.")
    if loaded.superseded:
        out.append(f"{loaded.superseded} older run(s) of cases that were run again are not shown; "
                   f"each case reports its latest run.")
    for item in loaded.skipped_files:
        out.append(f"Skipped unreadable result file {item}.")
    ok = frame[frame.status == "ok"]
    noisy = ok[pd.to_numeric(ok.step_time_stddev_s) > NOISY_CV * pd.to_numeric(ok.step_time_mean_s)]
    if not noisy.empty:
        names = ", ".join(r.case_id for r in noisy.itertuples())
        out.append(f"{len(noisy)} case(s) have a step-time spread (stddev / mean) above {NOISY_CV:.0%}: "
                   f"{names}. Differences between strategies smaller than that spread are noise, not a "
                   f"ranking; rerun them with more steps (--llmbench-steps) on a quiet machine.")
    out.extend(superlinear_caveats(ok))
    negative = ok[pd.to_numeric(ok.step_overhead, errors="coerce") < 0]
    if not negative.empty:
        names = ", ".join(r.case_id for r in negative.itertuples())
        out.append(f"Overhead over the bare model is below zero for {names}: the compute-only probe's median "
                   f"step was slower than the training step's. The two are timed one after the other on the "
                   f"same devices, so this is noise: read such values as about 0, not as a gain (the "
                   f"projection counts a negative wrapper overhead as 0).")
    recompiled = ok[pd.to_numeric(ok.recompiles, errors="coerce") > 0]
    for r in recompiled.itertuples():
        out.append(Markdown(f"Case {md(r.case_id)} compiled {int(r.recompiles)} frame(s) again during its "
                            f"measured steps: those steps' times include compiling (variant compile; more "
                            f"warm-up steps, the profile's warmup_steps, move it out)."))
    out.extend(straggler_caveats(loaded))
    if (frame.peak_memory_kind == "cpu_peak_rss").any():
        out.append("On CPU, peak memory is the peak RSS of each rank process (VmHWM since the first "
                   "step); at small model sizes it is dominated by the PyTorch runtime itself.")
    return out


def stragglers(loaded: Loaded) -> list[dict[str, Any]]:
    """Each finished case of two or more ranks with per-rank times (its latest trial): the straggler
    metrics, the slowest rank's node, each rank's median compute-only and measured step, and
    whether it is a straggler the caveats name."""
    rows = []
    ok = loaded.frame[loaded.frame.status == "ok"]
    for row in ok.sort_values(["profile", "seq_len", "world_size", "strategy"]).itertuples():
        result = loaded.results[row.run_id]
        if len(result.per_rank) < 2:
            continue
        m = result.metrics
        ratio, share, rank = m.get("straggler_ratio"), m.get("slowest_rank_share"), m.get("slowest_rank")
        probe_steps = len(result.per_rank[0].get("compute_only_step_times_s", []))
        rows.append({
            "profile": row.profile, "strategy": row.strategy, "strategy_name": row.strategy_name,
            "device_key": row.device_key, "world_size": row.world_size,
            "seq_len": row.seq_len, "ratio": ratio, "ratio_max": m.get("straggler_ratio_max"),
            "rank": rank, "share": share, "probe_steps": probe_steps,
            "node": result.per_rank[rank]["node"] if rank is not None else None,
            "nodes": [p.get("node") for p in result.per_rank],
            "probe_medians": [_median(p.get("compute_only_step_times_s", [])) for p in result.per_rank],
            "step_medians": [_median(p.get("step_times_s", [])) for p in result.per_rank],
            "flagged": ratio is not None and ratio >= STRAGGLER_RATIO and share >= STRAGGLER_SHARE,
            "why_empty": result.null_reasons.get("straggler_ratio")})
    return rows


def _median(values: list[float]) -> float | None:
    return float(pd.Series(values).median()) if values else None


def straggler_caveats(loaded: Loaded) -> list[str]:
    """A line per case whose slowest rank was a straggler, and one per node slow in several cases."""
    rows = stragglers(loaded)
    out, nodes = [], Counter()
    for r in (r for r in rows if r["flagged"]):
        nodes[r["node"]] += 1
        out.append(f"Rank {r['rank']} (node {r['node']}) of {r['profile']}-{r['strategy']} "
                   f"ws{r['world_size']} s{r['seq_len']} was the slowest in {r['share']:.0%} of "
                   f"{r['probe_steps']} compute-only probe steps, {r['ratio']:.2f}x the median rank "
                   f"(up to {r['ratio_max']:.2f}x). In synchronous training every rank waits for it, "
                   f"so the case's step times are its: a slow device, a throttled or shared host, or "
                   f"a rank given more CPU threads than cores.")
    several_nodes = len({node for r in rows for node in r["nodes"]}) > 1
    for node, count in sorted(nodes.items()):
        if count > 1 and several_nodes:
            out.append(f"Node {node} held the straggler in {count} cases: look at that node before "
                       f"reading those cases as the strategies' own numbers.")
    return out
