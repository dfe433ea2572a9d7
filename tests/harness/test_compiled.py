"""Variant compile on CPU/gloo at ws2 (harness/compiled.py): compiled code really ran on every rank,
the losses are the eager run's, compile time, recompiles and graph breaks are recorded, and a recompile
forced inside the measured steps is counted and named in the report's caveats."""

import pytest

from tests.harness.conftest import COMPILED

# Compiled and eager kernels sum in other orders: fp32 losses agree to 1e-5 at most over 20 steps of the
# cpu profile (reports/compile/, every strategy); 1e-4 leaves room and is far below a step's change (~0.2).
PARITY = 1e-4


@pytest.mark.parametrize("strategy", sorted(COMPILED))
def test_compiled_cases_run_compiled_code_with_the_eager_losses(compiled_results, strategy_results, strategy):
    run, eager = compiled_results[strategy], strategy_results[strategy]
    assert run.ok, run.describe_failure()
    assert run.case_id == f"{strategy}+compile-ws2-seq64"
    assert run.strategy_config["compile"]
    # every rank compiled frames of its own (dynamo's counters, per rank in the result)
    assert [r["compiled_frames"] > 0 for r in run.per_rank] == [True, True]
    assert eager.ok and len(eager.losses) == eager.spec.steps
    assert run.losses == pytest.approx(eager.losses, abs=PARITY)
    assert run.metrics["compile_s"] > 0
    assert run.metrics["graph_breaks"] >= 0 and 0 <= run.metrics["compile_cache_hits"] <= 1
    assert eager.metrics["compile_s"] is None and "not compiled" in eager.null_reasons["compile_s"]


def test_a_recompile_inside_the_measured_steps_is_recorded(compiled_results):
    forced, clean = compiled_results["ddp"], compiled_results["fsdp"]
    assert forced.metrics["recompiles"] > 0  # LLMBENCH_RECOMPILE_AT=5: the last measured step
    assert clean.metrics["recompiles"] == 0


def test_the_report_sets_compile_beside_eager_and_names_a_recompile(compiled_results, strategy_results,
                                                                      tmp_path):
    from pytest_llmbench.report.findings import caveats
    from pytest_llmbench.report.load import load_results
    from pytest_llmbench.report.variants import variant_rows
    from pytest_llmbench.store import ResultStore

    store = ResultStore(tmp_path)
    for name, result in compiled_results.items():
        store.save(result, profile="cpu")
        store.save(strategy_results[name], profile="cpu")
    loaded = load_results(tmp_path)
    said = " ".join(str(c) for c in caveats(loaded))
    assert "ddp+compile-ws2-seq64 compiled" in said and "again during its measured steps" in said
    assert "fsdp+compile-ws2-seq64 compiled" not in said
    assert "not compiled" not in said  # the eager cases' empty compile metrics are no caveat
    rows = {r["strategy"]: r for r in variant_rows(loaded) if r["compiled"]}
    assert set(rows) == set(COMPILED)
    for name, row in rows.items():
        assert row["compile_s"] == compiled_results[name].metrics["compile_s"]
        assert row["loss_gap"] < PARITY
        saved = (strategy_results[name].metrics["step_time_median_s"]
                 - compiled_results[name].metrics["step_time_median_s"])
        faster = row["speed"] > 1 and "no significant difference" not in row["speed_text"]
        assert row["pays_off_after"] == (pytest.approx(row["compile_s"] / saved) if faster and saved > 0
                                         else None)
