from pathlib import Path

import pytest

from tests.procs import no_process_outlives_its_test  # noqa: F401 - autouse, every test

DATA = Path(__file__).resolve().parent.parent / "data"
SUITE = '''
def test_training(llmbench, llmbench_case):
    result = llmbench.run(llmbench_case)
    llmbench.check(result)
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester folder holding the benchmark suite and the tests' tiny CPU profile."""
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "tinycpu.toml").write_text((DATA / "tinycpu.toml").read_text())
    return pytester
