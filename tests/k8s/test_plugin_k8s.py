"""pytest --llmbench-launcher=k8s: the plugin through the real client to the fake API server."""

import json

import pytest

from tests.k8s.fake_cluster import FakeCluster
from tests.plugin.conftest import DATA, SUITE

pytest_plugins = "pytester"


def test_launcher_k8s_without_a_cluster_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(pytester.path / "no-such-kubeconfig"))
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("--llmbench-launcher=k8s")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmbench-launcher=k8s (command line --llmbench-launcher): "
                                 "no cluster configuration: kubeconfig*no-such-kubeconfig*does not exist*"])


def test_a_case_through_the_plugin_on_kubernetes(pytester, tmp_path):
    cluster = FakeCluster(tmp_path / "pods")
    try:
        kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
        pytester.makepyfile(test_suite=SUITE)
        (pytester.path / "tinycpu.toml").write_text((DATA / "tinycpu.toml").read_text())
        result = pytester.runpytest_subprocess(
            "-m", "tinycpu and k8s", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp",
            "--world-size=2", "--llmbench-launcher=k8s", f"--llmbench-k8s-kubeconfig={kubeconfig}",
            "--llmbench-output=out", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*tinycpu-ddp-ws2-seq64: launching on k8s*",
                                     "tinycpu-ddp-ws2-seq64 * ok"])
        stored = json.loads(next((pytester.path / "out" / "results").glob("*/tinycpu-ddp-ws2-seq64.json"))
                            .read_text())
        assert stored["status"] == "ok" and stored["metrics"]["scaling_efficiency"] > 0
        assert cluster.objects == {}
        jobs = [path for method, path in cluster.requests if method == "POST" and path.endswith("/jobs")]
        assert len(jobs) == 2  # the ws1 baseline, then the case
    finally:
        cluster.close()
