"""Every stored file is untrusted input (issue 26, item 3): a file that is not a valid result is
skipped and named with its reason, the rest is reported, and nothing is written through a
symlink. Each malformed file below once broke the whole report (and the last two the store
loading a benchmark session uses to find a baseline)."""

import json
import warnings

from pytest_llmbench.report import build_report
from pytest_llmbench.report.escape import text
from pytest_llmbench.store import ResultStore
from tests.unit.test_report import raw, store  # noqa: F401 - the fixture


def malformed(store) -> dict[str, bytes]:  # noqa: F811
    good = raw(store, "tinycpu-ddp-ws1-seq64")

    def variant(**changes) -> bytes:
        data = json.loads(json.dumps(good))
        for dotted, value in changes.items():
            *parents, leaf = dotted.split("__")
            target = data
            for key in parents:
                target = target[key]
            target[leaf] = value
        return json.dumps(data).encode()

    infinite = variant().replace(b'"tokens_per_s": ' + str(good["metrics"]["tokens_per_s"]).encode(),
                                 b'"tokens_per_s": Infinity')
    assert b"Infinity" in infinite
    return {
        "metrics-list": (variant(metrics=[1, 2]), "metrics: list where dict belongs"),
        "env-string": (variant(env="cpu"), "env: str where dict belongs"),
        "created-number": (variant(created_utc=20261123), "created_utc: int where str belongs"),
        "tps-list": (variant(metrics__tokens_per_s=[12000]), "metrics.tokens_per_s: [12000]"),
        # 37c90cc passed text here, and both report commands then exited 1 with a traceback
        "tps-string": (variant(metrics__tokens_per_s="12000"), "metrics.tokens_per_s: '12000' is text"),
        "losses-text": (variant(losses=["low"]), "losses: not a list of finite numbers"),
        "infinite-tps": (infinite, "Infinity is not a finite number"),
        "latin-1": (variant(error="caf\u00e9").replace(b"caf\\u00e9", "caf\u00e9".encode("latin-1")),
                    "not UTF-8 text"),
        "deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        # finite, but two of them overflowed statistics.fmean in the report, --history and the gate
        "huge-tps": (variant(metrics__tokens_per_s=1.7e308), "is not a finite number within 1e+30"),
        "huge-step": (variant(step_times_s=[1.7e308, 1.7e308]), "step_times_s: not a list of finite numbers"),
    }


def test_each_malformed_file_is_skipped_and_named_and_the_rest_reported(store):  # noqa: F811
    bad_dir = store / "results" / "20990101T000000Z-bad1"
    bad_dir.mkdir()
    cases = malformed(store)
    for name, (content, _) in cases.items():
        (bad_dir / f"tinycpu-{name}.json").write_bytes(content)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each skipped file also warns
        assert build_report(store, echo=lambda _: None) == 0
        baselines = ResultStore(store).load_all()  # what a session searches for a stored baseline
    report = (store / "report" / "REPORT.md").read_text()
    assert "| tinycpu | ddp | 1 | 64 |" in report  # the good results are reported
    for name, (_, reason) in cases.items():
        line = next(x for x in report.splitlines() if f"tinycpu-{name}.json" in x)
        # as REPORT.md prints stored text: escaped for markdown (pytest_llmbench/report/escape.py)
        assert "Skipped unreadable result file" in line and text(reason) in line, (name, line)
    assert "Infinity" not in report.split("## Winners")[1].split("##")[0]
    assert len(baselines) == 5  # the five good files, none of the bad ones


def test_a_store_of_only_unreadable_results_is_an_error_not_no_results(store, tmp_path):  # noqa: F811
    """Files a newer plugin wrote (one unknown field each): the report said "no stored results", exit 0."""
    only = tmp_path / "out"
    folder = only / "results" / "20990101T000000Z-new1"
    folder.mkdir(parents=True)
    for path in (store / "results").glob("*/*.json"):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "spec" in data:
            (folder / path.name).write_text(json.dumps({**data, "written_by_a_newer_plugin": 1}))
    said = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert build_report(only, echo=said.append) == 1
    assert "none of the stored results" in said[0] and "unknown result field(s): written_by_a_newer_plugin" \
        in said[0]
    assert not (only / "report" / "REPORT.md").exists()


def test_the_report_replaces_a_symlink_at_its_path_and_never_writes_through_it(store, tmp_path):  # noqa: F811
    victim = tmp_path / "victim.md"
    victim.write_text("mine")
    (store / "report").mkdir()
    for name in ("REPORT.md", "metrics.csv"):
        (store / "report" / name).symlink_to(victim)
    assert build_report(store, echo=lambda _: None) == 0
    assert victim.read_text() == "mine"
    for name in ("REPORT.md", "metrics.csv"):
        path = store / "report" / name
        assert not path.is_symlink() and path.stat().st_size > 100
