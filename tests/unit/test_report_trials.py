"""The report of cases that ran several trials: rows per trial, aggregates, and comparisons
that call a winner only when the trials say so. Built from the committed tiny-GPT results
(tests/data/store) copied into trials whose tokens/s are set by hand."""

import json
from pathlib import Path

import pandas as pd
import pytest

from pytest_llmbench import stats
from pytest_llmbench.report import build_report
from pytest_llmbench.report.findings import winners
from pytest_llmbench.report.load import load_results

STORE = Path(__file__).resolve().parent.parent / "data" / "store"
SESSION = "20261201T000000Z-tria"


def write_trials(root: Path, session: str, tokens_per_s: dict[str, list[float]]) -> None:
    """Stored trials of each named case, trial k with the k-th tokens/s given."""
    folder = root / "results" / session
    folder.mkdir(parents=True)
    for name, values in tokens_per_s.items():
        data = json.loads(next(STORE.glob(f"results/*/{name}.json")).read_text())
        for k, value in enumerate(values, 1):
            data.update(trial=k, run_id=f"{name}-{session}-{k}", created_utc=f"{session[:8]}T0{k}:00:00",
                        schema_version=2)
            data["metrics"] = {**data["metrics"], "tokens_per_s": value}
            suffix = f"-trial{k}" if k > 1 else ""
            (folder / f"{name}{suffix}.json").write_text(json.dumps(data))


CLEAR = {"tinycpu-ddp-ws1-seq64": [1000.0, 1020.0, 980.0],
         "tinycpu-ddp-ws2-seq64": [1800.0, 1830.0, 1770.0],
         "tinycpu-zero2-ws1-seq64": [800.0, 790.0, 810.0],
         "tinycpu-zero2-ws2-seq64": [1500.0, 1480.0, 1520.0]}


@pytest.fixture
def store(tmp_path):
    write_trials(tmp_path, SESSION, CLEAR)
    return tmp_path


def test_the_csv_has_a_row_per_trial_and_the_cases_aggregate(store):
    assert build_report(store, echo=lambda _: None) == 0
    csv = pd.read_csv(store / "report" / "metrics.csv")
    assert len(csv) == 12 and sorted(csv.trial.unique()) == [1, 2, 3]
    ddp2 = csv[(csv.strategy == "ddp") & (csv.world_size == 2)].sort_values("trial")
    assert ddp2.tokens_per_s.tolist() == [1800.0, 1830.0, 1770.0]
    s = stats.summary([1800.0, 1830.0, 1770.0])
    row = ddp2.iloc[0]
    assert (row.case_trials, row.case_trials_ok) == (3, 3)
    assert (row.case_tokens_per_s_mean, row.case_tokens_per_s_ci_low, row.case_tokens_per_s_ci_high,
            row.case_tokens_per_s_cv) == pytest.approx((1800.0, s.low, s.high, s.cv))
    # each trial paired with its round's baseline (issue 23): the rounds moved together, so the
    # interval is narrower than the unpaired one over both sides' trials
    r = stats.paired_ratio_interval([(1800.0, 1000.0), (1830.0, 1020.0), (1770.0, 980.0)])
    unpaired = stats.ratio_interval([1800.0, 1830.0, 1770.0], [1000.0, 1020.0, 980.0])
    assert r.high - r.low < (unpaired.high - unpaired.low) / 3
    assert row.case_scaling_efficiency == pytest.approx(1800 / (2 * 1000))
    assert (row.case_scaling_efficiency_ci_low, row.case_scaling_efficiency_ci_high) == pytest.approx(
        (r.low / 2, r.high / 2))
    per_round = [1800 / 2000, 1830 / 2040, 1770 / 1960]  # each trial against its round's baseline
    assert ddp2.scaling_efficiency.tolist() == pytest.approx(per_round)


def test_a_clear_difference_is_called_and_an_overlap_is_not(tmp_path):
    write_trials(tmp_path, SESSION, CLEAR)
    loaded = load_results(tmp_path)
    fastest = {w["world_size"]: w for w in winners(loaded.frame) if w["metric"] == "tokens_per_s"}
    assert fastest[2]["strategy"] == "ddp" and not fastest[2]["tie"]
    assert "95% interval 1.1" in fastest[2]["margin"] and "over 3 vs 3 trials" in fastest[2]["margin"]
    close = {**CLEAR, "tinycpu-zero2-ws2-seq64": [1650.0, 1900.0, 1700.0]}  # mean 1750 vs 1800, wide
    write_trials(tmp_path / "close", SESSION, close)
    found = {w["world_size"]: w for w in winners(load_results(tmp_path / "close").frame)
             if w["metric"] == "tokens_per_s"}
    assert found[2]["tie"] and "no significant difference" in found[2]["margin"]


def test_the_report_shows_intervals_trials_and_the_trials_needed(store):
    build_report(store, echo=lambda _: None)
    report = (store / "report" / "REPORT.md").read_text()
    cv = stats.summary([1500.0, 1480.0, 1520.0]).cv
    assert "| tinycpu-zero2-ws2-seq64 | 3 of 3 | 1,500, 1,480, 1,520 |" in report
    assert f"| {cv:.1%} | {stats.trials_needed(cv, 0.05)} |" in report
    eff = stats.paired_ratio_interval([(1800.0, 1000.0), (1830.0, 1020.0), (1770.0, 980.0)])
    assert f"| ddp | 1.00 | 0.90 ({eff.low / 2:.2f} to {eff.high / 2:.2f}) |" in report
    assert "ran one trial" not in report


def test_the_trials_table_says_each_cases_mean_slot_in_the_launch_order(tmp_path):
    """Two cases, two rounds, run A B then B A: each case's mean slot is 2.5. A third stored session
    does not move the slots of this one (slots count within a session)."""
    write_trials(tmp_path, SESSION, {"tinycpu-ddp-ws1-seq64": [1000.0, 1010.0],
                                     "tinycpu-zero2-ws1-seq64": [800.0, 790.0]})
    order = {"tinycpu-ddp-ws1-seq64.json": "01", "tinycpu-zero2-ws1-seq64.json": "02",
             "tinycpu-zero2-ws1-seq64-trial2.json": "03", "tinycpu-ddp-ws1-seq64-trial2.json": "04"}
    for name, hour in order.items():
        path = tmp_path / "results" / SESSION / name
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "created_utc": f"20261201T{hour}:00:00"}))
    write_trials(tmp_path, "20261130T000000Z-othr", {"tinycpu-ddp-ws2-seq64": [1.0]})
    loaded = load_results(tmp_path)
    slots = dict(zip(loaded.frame.case_id, loaded.frame.case_mean_slot, strict=True))
    assert slots == {"ddp-ws1-seq64": 2.5, "zero2-ws1-seq64": 2.5, "ddp-ws2-seq64": 1.0}
    assert sorted(loaded.trials.launch_slot[loaded.trials.case_id == "ddp-ws1-seq64"]) == [1, 4]
    build_report(tmp_path, echo=lambda _: None)
    report = (tmp_path / "report" / "REPORT.md").read_text()
    assert "| tinycpu-zero2-ws1-seq64 | 2 of 2 | 800, 790 |" in report
    assert report.split("| tinycpu-zero2-ws1-seq64 | 2 of 2 |")[1].splitlines()[0].endswith("| 2.5 |")


def test_only_the_latest_sessions_trials_of_a_case_are_reported(store):
    write_trials(store, "20261202T000000Z-newr", {"tinycpu-ddp-ws2-seq64": [2000.0, 2100.0]})
    loaded = load_results(store)
    ddp2 = loaded.trials[(loaded.trials.strategy == "ddp") & (loaded.trials.world_size == 2)]
    assert sorted(ddp2.tokens_per_s) == [2000.0, 2100.0] and loaded.superseded == 3


def test_a_failed_trial_is_a_caveat_and_the_case_keeps_its_finished_trials(store):
    path = store / "results" / SESSION / "tinycpu-zero2-ws2-seq64-trial2.json"
    data = json.loads(path.read_text())
    data.update(status="timeout", error="no progress for 60 s", metrics={}, step_times_s=[], env={})
    path.write_text(json.dumps(data))
    build_report(store, echo=lambda _: None)
    report = (store / "report" / "REPORT.md").read_text()
    assert ("Case tinycpu-zero2-ws2-seq64 (trial 2 of 3) ended with status **timeout**: no progress "
            "for 60 s") in report
    assert "| tinycpu-zero2-ws2-seq64 | 2 of 3 | 1,500, 1,520 |" in report
