"""Values that once slipped past validation (issue 26, item 6), refused where they enter."""

import pytest

from pytest_llmbench.launchers.k8s import values as k8s_values
from pytest_llmbench.store import ResultStore


@pytest.mark.parametrize("check, value", [
    (k8s_values.quantity, "\uff11Gi"),  # a full-width digit one
    (k8s_values.quantity, "\u0661\u0660Mi"),  # Arabic-Indic digits
    (k8s_values.image, "registry.example.com/harness:v\u00e9"),  # \\w in the tag matched accents
])
def test_kubernetes_rules_take_ascii_only(check, value):
    assert check(value) is not None


def test_kubernetes_ttl_is_whole_seconds_and_timeouts_finite():
    assert k8s_values.placement_problem({"ttl_s": 1.5})[0] == "ttl_s"
    assert k8s_values.placement_problem({"ttl_s": 600}) is None
    assert k8s_values.placement_problem({"schedule_timeout_s": float("inf")})[0] == "schedule_timeout_s"


@pytest.mark.parametrize("name", ["../..", "/etc", ".", "a/b"])
def test_a_compared_session_is_a_folder_name_in_the_store_never_a_path(tmp_path, name):
    store = ResultStore(tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="is not a session id"):
        store.resolve_session(name)
