"""The report's Variants section: each variant against its plain strategy, from stored results
(the committed tiny-GPT runs, copied as an ``ac`` variant with numbers set by hand)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from pytest_llmbench.report import build_report
from pytest_llmbench.report.load import load_results
from pytest_llmbench.report.variants import variant_rows

STORE = Path(__file__).resolve().parent.parent / "data" / "store"


def stored(name: str) -> dict:
    return json.loads(next(STORE.glob(f"results/*/{name}.json")).read_text())


@pytest.fixture
def store(tmp_path):
    folder = tmp_path / "results" / "20261201T000000Z-vari"
    folder.mkdir(parents=True)
    for ws in (1, 2):
        base = stored(f"tinycpu-ddp-ws{ws}-seq64")
        (folder / f"tinycpu-ddp-ws{ws}-seq64.json").write_text(json.dumps(base))
        ac = json.loads(json.dumps(base))
        ac["spec"]["variant"] = "ac"
        ac["run_id"] += "-ac"
        ac["metrics"]["tokens_per_s"] = base["metrics"]["tokens_per_s"] * (0.8 if ws == 2 else 0.9)
        ac["metrics"]["peak_memory_gib"] = base["metrics"]["peak_memory_gib"] * 0.5
        ac["losses"] = [loss + (0.01 if i == 3 else 0.0) for i, loss in enumerate(base["losses"])]
        (folder / f"tinycpu-ddp+ac-ws{ws}-seq64.json").write_text(json.dumps(ac))
    return tmp_path


def test_a_variant_is_compared_with_its_base_at_the_same_world_size(store):
    rows = {v["world_size"]: v for v in variant_rows(load_results(store))}
    assert rows[2]["strategy"] == "ddp" and rows[2]["variant"] == "ac"
    assert rows[2]["speed"] == pytest.approx(0.8) and rows[2]["memory"] == pytest.approx(0.5)
    assert rows[2]["loss_gap"] == pytest.approx(0.01)
    assert rows[1]["speed"] == pytest.approx(0.9)


def test_a_variant_scales_against_its_own_baseline_and_is_named_as_run(store):
    assert build_report(store, echo=lambda _: None) == 0
    csv = pd.read_csv(store / "report" / "metrics.csv")
    ac2 = csv[(csv.strategy == "ddp+ac") & (csv.world_size == 2)].iloc[0]
    base2 = csv[(csv.strategy == "ddp") & (csv.world_size == 2)].iloc[0]
    assert ac2.variant == "ac" and base2.variant == "base"
    assert ac2.scaling_efficiency == pytest.approx(base2.scaling_efficiency * 0.8 / 0.9)  # ws1 of ddp+ac
    report = (store / "report" / "REPORT.md").read_text()
    assert "| tinycpu | 64 | 2 | ddp | ac | 0.80x" in report and "| 0.50x |" in report
    assert (store / "report" / "plots" / "variants.png").stat().st_size > 0
