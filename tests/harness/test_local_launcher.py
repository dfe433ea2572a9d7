"""The local launcher's isolation: two cases at once, as two suites on one host would run."""

from concurrent.futures import ThreadPoolExecutor

from tests.harness.conftest import launch, tiny_spec


def test_two_cases_at_once_each_get_their_own_rendezvous(tmp_path):
    spec = tiny_spec(strategy="ddp", steps=3, warmup_steps=1)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(launch, spec, tmp_path / name) for name in ("a", "b")]
        results = [run.result() for run in runs]
    assert [r.status for r in results] == ["ok", "ok"], [r.describe_failure() for r in results]
    assert results[0].run_id != results[1].run_id
    assert results[0].losses == results[1].losses  # same spec, same seed: same numbers
