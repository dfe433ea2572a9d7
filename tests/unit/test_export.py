"""``llmbench-report --export``: the committed CPU store (tests/data/store) in each dashboard format, read
back by the format's own validator or reader: Bencher's published BMF JSON Schema
(tests/data/formats/bencher-bmf.schema.json), ``pytest-benchmark compare`` (pytest-benchmark's own
reader) and, for PyTorch's OSS benchmark records (no schema published), the record's fields as
PyTorch's pr_time_benchmarks and vLLM's benchmark_utils write them."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from harness.result import BenchResult
from harness.spec import RunSpec
from pytest_llmbench.report import export
from pytest_llmbench.report.__main__ import main
from pytest_llmbench.store import ResultStore

DATA = Path(__file__).resolve().parent.parent / "data"
CASES = {"tinycpu/ddp-ws1-seq64", "tinycpu/ddp-ws2-seq64", "tinycpu/zero2-ws1-seq64",
         "tinycpu/zero2-ws2-seq64", "tinycpu/zero3-ws2-seq64"}


@pytest.fixture
def store(tmp_path):
    shutil.copytree(DATA / "store" / "results", tmp_path / "results")
    spec = RunSpec.from_preset("tiny", strategy="fsdp", world_size=2, seq_len=64)
    failed = BenchResult.failure(spec, status="oom", run_id="tinycpu-fsdp-ws2-seq64-0f0f0f",
                                 error="CUDA out of memory")
    ResultStore(tmp_path).save(failed, profile="tinycpu")
    return tmp_path


def raw(store, case):
    return json.loads(next((store / "results").glob(f"*/tinycpu-{case}.json")).read_text())


def exported(store, fmt, capsys):
    assert main([str(store), "--export", fmt]) == 0
    said = capsys.readouterr().out
    assert f"llmbench export ({fmt}): 5 case(s) written to " in said
    assert "; 1 left out (no value to export: failed cases)" in said  # the OOM case, not written as 0
    path = store / "report" / "export" / f"{fmt}.json"
    return path, json.loads(path.read_text())


def test_bencher_export_is_valid_bmf_with_the_stored_numbers(store, capsys):
    _, document = exported(store, "bencher", capsys)
    jsonschema.validate(document, json.loads((DATA / "formats" / "bencher-bmf.schema.json").read_text()))
    assert set(document) == CASES
    ddp2 = document["tinycpu/ddp-ws2-seq64"]
    stored = raw(store, "ddp-ws2-seq64")["metrics"]
    assert ddp2["tokens-per-s"]["value"] == pytest.approx(stored["tokens_per_s"])
    assert ddp2["peak-memory-gib"]["value"] == pytest.approx(stored["peak_memory_gib"])
    assert ddp2["step-time-median-s"]["value"] == pytest.approx(stored["step_time_median_s"])
    assert "mfu" not in ddp2  # no peak FLOP/s on this CPU: left out, not 0
    assert all(len(slug) <= 64 for measures in document.values() for slug in measures)  # Bencher's limit


def test_pytorch_hud_records_have_the_fields_pytorch_reads(store, capsys):
    _, records = exported(store, "pytorch-hud", capsys)
    assert isinstance(records, list) and records
    for record in records:
        assert set(record) <= {"benchmark", "model", "inputs", "metric", "runners"}
        assert isinstance(record["benchmark"]["name"], str) and isinstance(record["model"]["name"], str)
        values = record["metric"]["benchmark_values"]
        assert values and all(isinstance(v, float) and math.isfinite(v) for v in values)
        assert record["metric"]["name"] in export.MEASURES
    tokens = [r for r in records if r["metric"]["name"] == "tokens_per_s"
              and r["metric"]["extra_info"]["case"] == "tinycpu/zero3-ws2-seq64"]
    assert len(tokens) == 1
    assert tokens[0]["metric"]["benchmark_values"] == [pytest.approx(raw(store, "zero3-ws2-seq64")["metrics"]
                                                                     ["tokens_per_s"])]
    assert tokens[0]["benchmark"]["extra_info"]["world_size"] == 2
    assert tokens[0]["model"]["backend"] == "zero3"


def test_pytest_benchmark_export_reads_in_pytest_benchmark_compare(store, capsys):
    path, document = exported(store, "pytest-benchmark", capsys)
    entry = next(b for b in document["benchmarks"] if b["name"] == "tinycpu/ddp-ws1-seq64")
    stored = raw(store, "ddp-ws1-seq64")
    assert entry["stats"]["data"] == stored["step_times_s"]
    assert entry["stats"]["rounds"] == len(stored["step_times_s"])
    assert entry["extra_info"]["tokens_per_s"] == pytest.approx(stored["metrics"]["tokens_per_s"])
    reader = "import sys; from pytest_benchmark.cli import main; sys.exit(main())"  # its console script
    compare = subprocess.run([sys.executable, "-c", reader, "compare", str(path),
                              "--columns=median,rounds"], capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0, compare.stderr
    assert all(case in compare.stdout for case in CASES)
    assert "benchmark 'tinycpu ddp seq64': 2 tests" in compare.stdout


def test_export_usage_errors_say_what_was_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--export", "bencher"])
    assert info.value.code == 2
    assert f"--export: no stored case under {tmp_path} has a value to export" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--export-to", str(tmp_path / "x.json")])
    assert "--export-to: give --export FORMAT too" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--export", "grafana"])
    assert "invalid choice: 'grafana'" in capsys.readouterr().err


@pytest.mark.parametrize("target, said", [
    ("folder", "is a folder; name the file to write"),
    ("under-a-file", "is not a folder"),
    ("symlink", "is a symlink (an export never writes through one)"),
    ("stored", "is inside the results store"),
    ("unwritable", "cannot write /proc"),  # as root a folder's mode bits do not stop a write; /proc does
])
def test_an_export_target_that_is_not_a_new_file_is_refused_and_nothing_changes(store, tmp_path, capsys,
                                                                                 target, said):
    """Each was a traceback or an overwrite: --export-to a stored result replaced it, and the case was
    gone from the store; a symlink's target was overwritten."""
    victim = next((store / "results").glob("*/tinycpu-ddp-ws2-seq64.json"))
    before = victim.read_bytes()
    (tmp_path / "elsewhere.txt").write_text("keep me")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "locked").mkdir()
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.txt")
    path = {"folder": tmp_path / "locked", "under-a-file": tmp_path / "a-file" / "x.json",
            "symlink": tmp_path / "link.json", "stored": victim,
            "unwritable": Path("/proc/llmbench-export.json")}[target]
    with pytest.raises(SystemExit) as info:
        main([str(store), "--export", "bencher", "--export-to", str(path)])
    assert info.value.code == 2
    assert said in capsys.readouterr().err
    assert victim.read_bytes() == before and (tmp_path / "elsewhere.txt").read_text() == "keep me"


def test_the_same_case_from_two_machines_is_two_entries(store, capsys):
    """Two devices' runs of one case: the report keeps them apart, and so does the export ("2 written"
    with one entry in the file before)."""
    first = next((store / "results").glob("*/tinycpu-ddp-ws2-seq64.json"))
    other = json.loads(first.read_text())
    other["env"]["device_name"] = "Other CPU"
    other["run_id"] = other["run_id"] + "-b"
    (store / "results" / "20260101T000000Z-beef").mkdir()
    (store / "results" / "20260101T000000Z-beef" / "tinycpu-ddp-ws2-seq64.json").write_text(json.dumps(other))
    assert main([str(store), "--export", "bencher"]) == 0
    said = capsys.readouterr().out
    written = int(said.split("): ")[1].split(" case")[0])
    document = json.loads((store / "report" / "export" / "bencher.json").read_text())
    assert written == len(document) == 6
    assert sum(name.startswith("tinycpu/ddp-ws2-seq64") for name in document) == 2
