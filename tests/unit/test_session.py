"""Where a case's scaling baseline comes from: this session first, then the results store."""

import shutil
from pathlib import Path

from pytest_llmbench.session import BenchSession
from pytest_llmbench.settings import Settings
from pytest_llmbench.store import ResultStore, read_file

STORE = Path(__file__).resolve().parent.parent / "data" / "store"


def session_over(tmp_path, launcher: str = "local") -> BenchSession:
    shutil.copytree(STORE / "results", tmp_path / "results")
    return BenchSession(settings=Settings(values={"launcher": launcher}), profiles={},
                        store=ResultStore(tmp_path))


def stored(name):
    return read_file(next((STORE / "results").glob(f"*/{name}.json")))


def test_a_baseline_comes_from_the_store_when_the_session_has_none(tmp_path):
    session = session_over(tmp_path)
    profile, ws2 = stored("tinycpu-ddp-ws2-seq64")
    found = session.find_baseline(profile, ws2.spec, 1)
    assert found is not None and found.run_id == stored("tinycpu-ddp-ws1-seq64")[1].run_id
    assert session.find_baseline(profile, stored("tinycpu-zero3-ws2-seq64")[1].spec, 1) is None  # none stored


def test_a_stored_baseline_of_another_launcher_is_not_used(tmp_path):
    """The stored runs ran locally (before the launcher was recorded, so local): no baseline for
    a Slurm session, whose ranks run on other hosts."""
    profile, ws2 = stored("tinycpu-ddp-ws2-seq64")
    assert session_over(tmp_path / "slurm", "slurm").find_baseline(profile, ws2.spec, 1) is None


def test_this_sessions_baseline_wins_and_the_store_is_not_read(tmp_path, monkeypatch):
    session = session_over(tmp_path)
    profile, ws1 = stored("tinycpu-ddp-ws1-seq64")
    mine = ws1.replace(run_id="this-session")
    session.records.append((profile, mine))

    def no_store_read():
        raise AssertionError("the store was read although this session has the baseline")

    monkeypatch.setattr(session.store, "load_all", no_store_read)
    assert session.find_baseline(profile, stored("tinycpu-ddp-ws2-seq64")[1].spec, 1) is mine
