"""When a pool of warm ranks serves a case, and when it is retired (launchers/local/warm.py); the
pools themselves run in tests/harness/test_warm.py."""

import shutil

import pytest

from harness.spec import RunSpec
from pytest_llmbench.launchers.local import warm


@pytest.fixture
def pool():
    made = warm.WarmPool(key=(), nproc=2, backend="gloo", env={}, mark="pool-test")
    yield made
    shutil.rmtree(made.folder, ignore_errors=True)


def done(rc=0, **held):
    return {int(rank[1:]): {"event": "done", "rank": int(rank[1:]), "rc": rc, "rss_gib": gib,
                            "device_allocated_gib": None} for rank, gib in held.items()}


def test_a_pool_is_for_one_world_size_backend_and_environment(monkeypatch):
    spec = RunSpec.from_preset("tiny", world_size=2)
    key = warm.Pools.key(spec, {"A": "1"})
    assert warm.Pools.key(spec, {"A": "1"}) == key
    assert warm.Pools.key(spec, {"A": "2"}) != key  # the profile's [env], a fault: a new pool
    assert warm.Pools.key(spec.replace(world_size=1), {"A": "1"}) != key
    assert warm.Pools.key(spec.replace(device="cuda"), {"A": "1"}) != key
    other = warm.Host(python="/opt/venv-old/bin/python")  # an A/B session's baseline interpreter
    assert warm.Pools.key(spec, {"A": "1"}, other) != key
    assert warm.Pools.key(spec, {"A": "1"}, warm.Host(cwd="/tmp/worktree")) != key
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # the launcher's own environment counts too
    assert warm.Pools.key(spec, {"A": "1"}) != key
    monkeypatch.delenv("NCCL_ALGO")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # changes with every test
    assert warm.Pools.key(spec, {"A": "1"}) == key
    # an exported variable wins over the profile's: the pool's ranks run with the shell's value
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ens3")
    assert warm.Pools.key(spec, {"NCCL_SOCKET_IFNAME": "eth0"}) == warm.Pools.key(spec, {})


def test_the_users_exported_variables_win_over_a_profiles_env(monkeypatch):
    """A profile describes a typical host, the shell this one: `export NCCL_SOCKET_IFNAME=ens3` on an
    OCI VM must reach the ranks though the profile says eth0 (on 37c90cc the profile won, and NCCL's
    bootstrap found no interface at ws1). What the shell does not set, the profile supplies."""
    from pytest_llmbench.launchers.base import host_env

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ens3")
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    merged = host_env({"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"})
    assert (merged["NCCL_SOCKET_IFNAME"], merged["NCCL_DEBUG"]) == ("ens3", "WARN")


def test_no_built_in_profile_names_a_network_interface():
    """Interfaces are the host's to name (ens3 on OCI VMs, eth0 in pods, ib0...): NCCL picks one."""
    from pytest_llmbench import profiles

    loaded = profiles.load_profiles()
    assert len(loaded) >= 8
    for name, profile in loaded.items():
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} & set(profile.env), name


def test_a_case_spanning_nodes_runs_fresh():
    assert warm.can_serve(RunSpec.from_preset("tiny", world_size=2)) is None
    assert "spans nodes" in warm.can_serve(RunSpec.from_preset("tiny", world_size=4, nnodes=2))
    offload = RunSpec.from_preset("tiny", world_size=2, device="cuda", strategy="fsdp", variant="offload")
    assert "CPU collective" in warm.can_serve(offload)  # a pool's group is NCCL only


def test_offload_gets_a_cpu_backend_beside_nccl():
    """FSDP2's CPU offload reduces the gradient norm over CPU tensors: its group maps cpu to gloo.
    Held to torch's own parsing of the backend string (BackendConfig, distributed_c10d.py), which
    init_process_group uses to pick a backend per device type."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from harness.dist import process_group_backend

    def devices(spec):
        return BackendConfig(Backend(process_group_backend(spec))).get_device_backend_map()

    gpu = RunSpec.from_preset("tiny", world_size=2, device="cuda", strategy="fsdp")
    assert devices(gpu) == {"cuda": "nccl"}  # no CPU collective: an offloaded norm would fail here
    assert devices(gpu.replace(variant="offload")) == {"cuda": "nccl", "cpu": "gloo"}
    assert devices(gpu.replace(device="cpu")) == {"cpu": "gloo", "cuda": "gloo"}


def test_a_pool_that_keeps_its_memory_serves_on(pool):
    for _ in range(3):
        pool.cases += 1
        pool._after_case(done(r0=0.46, r1=0.47))
    assert pool.retire_reason == "" and not pool.broken
    assert pool.describe(2)["held_after_gib"] == {"0": 0.46, "1": 0.47}


def test_a_pool_whose_rank_grows_is_retired(pool):
    pool.cases = 1
    pool._after_case(done(r0=0.46, r1=0.47))
    pool.cases = 2
    pool._after_case(done(r0=0.46, r1=0.47 + warm.GROWTH_GIB + 0.01))
    assert "rank 1 holds" in pool.retire_reason and "more than after its first case" in pool.retire_reason
    assert not pool.broken  # closed, not killed: its ranks are healthy


def test_a_failed_rank_or_enough_cases_retire_a_pool(pool):
    pool.cases = 1
    pool._after_case(done(rc=1, r0=0.46, r1=0.46))
    assert pool.retire_reason == "a rank failed" and pool.broken
    old = warm.WarmPool(key=(), nproc=1, backend="gloo", env={}, mark="pool-old")
    try:
        old.cases = warm.MAX_CASES
        old._after_case(done(r0=0.46))
        assert old.retire_reason == f"served {warm.MAX_CASES} cases" and not old.broken
    finally:
        shutil.rmtree(old.folder, ignore_errors=True)


def test_one_pool_at_a_time_holds_the_gpus(monkeypatch):
    """Idle ranks keep CUDA contexts on GPUs 0..k-1: a new GPU pool retires the other GPU pools
    first (EXCLUSIVE_PROCESS GPUs refuse a second context); CPU pools keep their two slots."""
    monkeypatch.setattr(warm.WarmPool, "start", lambda self, timeout_s, progress: None)
    monkeypatch.setattr(warm.WarmPool, "close", lambda self: shutil.rmtree(self.folder, ignore_errors=True))
    pools = warm.Pools()
    gpu = RunSpec.from_preset("tiny", world_size=1, device="cuda")
    say = [].append
    cpu_pools = [pools.get(gpu.replace(device="cpu", world_size=n), {}, timeout_s=1, progress=say)
                 for n in (1, 2)]
    assert len(pools.alive) == 2
    ws1 = pools.get(gpu, {}, timeout_s=1, progress=say)
    ws2 = pools.get(gpu.replace(world_size=2), {}, timeout_s=1, progress=say)
    assert list(pools.alive.values()) == [ws2] and ws1.retire_reason == warm.ONE_GPU_POOL
    assert cpu_pools[0].retire_reason == "another pool is needed"
    pools.close_all()


def test_importing_the_local_launcher_starts_and_registers_nothing():
    """A report build imports every launcher: the local one makes its warm pools when a case first
    needs them, not at import (37c90cc made them and registered an atexit hook on import)."""
    import subprocess
    import sys

    code = ("import atexit; calls = []; register = atexit.register\n"
            "atexit.register = lambda f, *a, **k: calls.append(getattr(f, '__qualname__', '?')) or "
            "register(f, *a, **k)\n"
            "from pytest_llmbench.launchers.local import launcher as local\n"
            "assert local._POOLS is None, local._POOLS; print(sorted(calls))\n"
            "pools = local.session_pools(); assert pools is local.session_pools(); print(sorted(calls))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    at_import, after = out.stdout.splitlines()
    assert "Pools.close_all" not in at_import and after.count("Pools.close_all") == 1, out.stdout
