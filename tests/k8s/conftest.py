import pytest

from harness.spec import RunSpec
from pytest_llmbench.launchers.k8s import K8sLauncher
from tests.k8s.fake_cluster import FakeCluster
from tests.procs import no_process_outlives_its_test  # noqa: F401 - autouse, every test

TINY = dict(micro_batch=4, grad_accum=2, seq_len=64, steps=5, warmup_steps=2, threads_per_rank=1,
            compute_probe_steps=2, lr=3e-3, data_pool=16)


def two_node_spec(**changes) -> RunSpec:
    """2 ranks on 2 "nodes" (pods), one rank each."""
    return RunSpec.from_preset("tiny", **{**TINY, "world_size": 2, "nnodes": 2, **changes})


@pytest.fixture
def cluster(tmp_path):
    fake = FakeCluster(tmp_path / "pods")
    yield fake
    fake.close()


@pytest.fixture
def launcher(cluster, tmp_path):
    return K8sLauncher(namespace="llmbench", image="llmbench/harness:test",
                       kubeconfig=str(cluster.kubeconfig(tmp_path / "kubeconfig")), poll_s=0.2)


def launch(launcher, tmp_path, spec=None, *, env=None, timeout_s=90, placement=None, progress=None):
    launcher.placement = placement or {}  # the profile's [k8s] table
    return launcher.run(spec or two_node_spec(), run_dir=tmp_path / "run", run_id="k8s-case-abc123",
                        timeout_s=timeout_s, env={"DS_ACCELERATOR": "cpu", **(env or {})},
                        progress=progress or (lambda line: None))
