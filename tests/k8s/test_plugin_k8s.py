"""pytest --llmbench-launcher=k8s: the plugin through the real client to the real control plane, with
the launcher's least-privilege kubeconfig."""

import json

import pytest

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


def test_a_case_through_the_plugin_on_kubernetes(pytester, cluster):
    kubeconfig = cluster.launcher_kubeconfig
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
    runs = sorted(p.name for p in (pytester.path / "out" / "runs").iterdir())
    assert len(runs) == 2 and all((pytester.path / "out" / "runs" / r / "manifests.yaml").exists()
                                  for r in runs)  # the ws1 baseline, then the case: two Jobs
