"""Where the cluster has no internet: the wheelhouse, an install from it, and the pod image.

Built and run for real, in minutes, not seconds, so not part of `make test`: `make
test-offline` (and `.ci/run`) runs this folder. Every step that claims "no network" runs in
a network namespace of its own (`unshare -n`: only a loopback, no route out), so a step that
reached for an index would fail here, not pass on a host that happened to be online.

Needs root (unshare, chroot builds), debootstrap and buildah (or a docker engine).
Set LLMBENCH_WHEELHOUSE, LLMBENCH_IMAGE_BASE or LLMBENCH_IMAGE to reuse a wheelhouse, a base image or
an image built from this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness.spec import RunSpec
from harness.transport import extract_marked
from pytest_llmbench.launchers.k8s.launcher import K8sLauncher
from pytest_llmbench.launchers.k8s.manifests import object_name
from tests.harness.conftest import tiny_spec
from tests.k8s.conftest import admitted, evicted_not_rerun, running_pods, workloads_seen
from tests.k8s.real_cluster import _tool, k8s_local
from tests.k8s.test_queue_and_owners import QUOTA, URGENT

k8s_kubelet = _tool("k8s_kubelet")

pytestmark = pytest.mark.offline
ROOT = Path(__file__).resolve().parents[2]
# pip with none of this machine's own configuration: no extra index, no local wheel folder.
NO_PIP_CONFIG = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}


def run(cmd: list[str], *, timeout: float, env: dict | None = None, cwd: Path = ROOT,
        ) -> subprocess.CompletedProcess:
    """Run to completion; on a timeout the whole process group is killed (nothing outlives it)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}:\n"
                                  f"{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def offline(cmd: list[str]) -> list[str]:
    """The command in a network namespace of its own: a loopback (for torchrun's rendezvous)
    and no route to anything else."""
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "offline", *cmd]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    if given := os.environ.get("LLMBENCH_WHEELHOUSE"):
        yield Path(given)
        return
    folder = tmp_path_factory.mktemp("wheelhouse")
    try:
        run(["make", "-s", "wheelhouse", f"WHEELHOUSE={folder}"], timeout=600)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # ~3 GB of wheels, not kept past this module


def test_the_wheelhouse_holds_every_pinned_package_as_a_wheel(wheelhouse):
    lines = [line for line in (wheelhouse / "requirements.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert all(" --hash=sha256:" in line for line in lines)  # pip's hash-checking mode, every pin
    pins = [line.split()[0] for line in lines]
    wheels = {p.name.split("-")[0].lower().replace("_", "-") for p in wheelhouse.glob("*.whl")}
    assert not list(wheelhouse.glob("*.tar.gz")), "an sdist in the wheelhouse would need a compiler"
    for pin in pins:
        name = pin.split("[")[0].split("==")[0]
        assert name in wheels, f"{pin} has no wheel in {wheelhouse}"
    constraints = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                       if "==" in line)
    for name in ("torch", "deepspeed", "pytest", "kubernetes"):
        assert f"{name}=={constraints[name]}" in pins  # the versions the tests ran with
    deepspeed = [p.name for p in wheelhouse.glob("deepspeed-*.whl")]
    assert deepspeed == [f"deepspeed-{constraints['deepspeed']}-py3-none-any.whl"]  # built here, pure


def test_the_hashed_requirements_install_offline_and_refuse_a_tampered_wheel(wheelhouse, tmp_path):
    """`pip install --require-hashes` from the wheelhouse, as its requirements.txt says, with no network
    (pip --dry-run: every wheel read and its digest checked, nothing installed); then the same with one
    wheel altered after the fact: pip refuses it, naming it and both digests."""
    venv = tmp_path / "venv"
    run(["python3", "-m", "venv", str(venv)], timeout=120)
    install = [str(venv / "bin" / "pip"), "install", "-q", "--dry-run", "--require-hashes", "--no-index"]
    requirements = ["-r", str(wheelhouse / "requirements.txt")]
    run(offline([*install, "--find-links", str(wheelhouse), *requirements]), timeout=300, env=NO_PIP_CONFIG)
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for wheel in wheelhouse.glob("*.whl"):
        (tampered / wheel.name).symlink_to(wheel.resolve())
    (victim,) = wheelhouse.glob("einops-*.whl")
    (tampered / victim.name).unlink()
    shutil.copy(victim, tampered / victim.name)
    import zipfile

    with zipfile.ZipFile(tampered / victim.name, "a") as wheel:
        wheel.writestr("einops-extra.txt", "not what was built")
    proc = subprocess.run(offline([*install, "--find-links", str(tampered), *requirements]), cwd=ROOT,
                          env={**os.environ, **NO_PIP_CONFIG}, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in proc.stderr
    assert f"einops=={victim.name.split('-')[1]} from file://{tampered / victim.name}" in proc.stderr


def test_the_cuda_images_wheelhouse_resolves_to_torchs_cuda_build(tmp_path):
    """The CUDA image's set (`make cuda-check`): PyPI's torch 2.13.0 itself, never a +cpu build, with
    the CUDA 13 runtime its metadata names. Resolved from the wheels' metadata, nothing downloaded
    (seconds; the 2.6 GB download and the image are `make image-cuda`, built once: docs/GPU.md)."""
    out = run(["make", "-s", "cuda-check", f"CUDA_WHEELHOUSE={tmp_path}"], timeout=300).stdout
    pins = dict(line.strip().split("==") for line in out.splitlines() if line.startswith("  "))
    assert pins["torch"] == "2.13.0" and pins["cuda-toolkit"].startswith("13.0")
    for library in ("nvidia-nccl-cu13", "nvidia-cudnn-cu13", "nvidia-cublas", "triton"):
        assert library in pins, library


def test_a_fresh_venv_installs_from_the_wheelhouse_with_no_network(wheelhouse, tmp_path):
    venv = tmp_path / "venv"
    # `make install OFFLINE=...`, exactly as the README gives it, with no network at all.
    run(offline(["make", "-s", "install", f"OFFLINE={wheelhouse}", f"VENV={venv}"]), timeout=600,
        env=NO_PIP_CONFIG)
    python = str(venv / "bin" / "python")
    imports = ("import torch, deepspeed, pynvml, kubernetes, kubernetes_validate, pandas, matplotlib, "
               "jinja2, xdist, pytest_benchmark, harness.train, pytest_llmbench.plugin; "
               "print(torch.__version__, deepspeed.__version__)")
    out = run(offline([python, "-c", imports]), timeout=120, env={"DS_ACCELERATOR": "cpu"}).stdout
    # The wheelhouse packs this host's own torch build (+cpu where the index serves one, else PyPI's
    # +cu130), so the fresh venv must report exactly the build the tests ran with, at the pinned versions.
    from importlib.metadata import version

    import torch

    constraints = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                       if "==" in line)
    assert out.split()[:2] == [torch.__version__, version("deepspeed")]
    assert torch.__version__.split("+")[0] == constraints["torch"]
    assert version("deepspeed") == constraints["deepspeed"]
    # The plugin loads from its entry point and collects the benchmark matrix from the root.
    out = run(offline([python, "-m", "pytest", "--collect-only", "-q", "-m", "cpu", "--strategy=ddp",
                       "-p", "no:cacheprovider"]), timeout=120).stdout
    assert "tests/benchmarks/test_training.py::test_training[cpu-ddp-ws1-seq128]" in out
    # The same venv runs a test file, offline (the whole of tests/unit ran in `make test`; here what
    # matters is that pytest and the project import and run with no network).
    run(offline([python, "-m", "pytest", "tests/unit/test_spec.py", "-q", "-p", "no:cacheprovider"]),
        timeout=300)


def builder() -> str:
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    if shutil.which("buildah"):
        return "buildah"
    pytest.fail("no image builder: neither a docker engine nor buildah (apt-get install buildah)")


@pytest.fixture(scope="module", autouse=True)
def base_build():
    """A Debian base made with debootstrap, standing in for a registry base. Started at once, in the
    background: it waits on the Debian mirror far more than on the CPU (about a minute), so it
    overlaps the wheelhouse and the install tests instead of adding to them."""
    if given := os.environ.get("LLMBENCH_IMAGE_BASE"):
        yield given, None
        return
    name = f"localhost/llmbench-test-base:{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([str(ROOT / "docker" / "debian-base.sh"), name], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    yield name, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    subprocess.run([builder(), "rmi", name], capture_output=True)


@pytest.fixture(scope="module")
def base_image(base_build):
    name, proc = base_build
    if proc is not None:
        try:
            out, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"docker/debian-base.sh {name} timed out after 600 s")
        assert proc.returncode == 0, f"docker/debian-base.sh {name} exited {proc.returncode}:\n{out[-3000:]}"
    return name


@pytest.fixture(scope="module")
def harness_image(wheelhouse, base_image):
    """`make image`, from the wheelhouse alone: the build has no network either. Removed with the module."""
    tool = builder()
    if given := os.environ.get("LLMBENCH_IMAGE"):
        yield tool, given
        return
    image = f"localhost/llmbench-test-harness:{uuid.uuid4().hex[:8]}"
    try:
        run(offline(["make", "-s", "image", f"WHEELHOUSE={wheelhouse}", f"BASE={base_image}",
                     f"IMAGE={image}"]), timeout=900, env={"BUILDER": tool})
        yield tool, image
    finally:
        subprocess.run([tool, "rmi", "-f", image], capture_output=True)


@pytest.mark.image
def test_the_cpu_image_builds_offline_from_the_wheelhouse_and_runs_a_case(harness_image, tmp_path):
    _check_the_image(*harness_image, tmp_path)


def _check_the_image(tool: str, image: str, tmp_path: Path) -> None:
    # the OCI labels say which commit and version built it (docker/build.sh)
    # (buildah's --format has no json function: the whole inspect output is JSON)
    if tool == "buildah":
        labels = json.loads(run(["buildah", "inspect", "--type", "image", image], timeout=60).stdout
                            )["OCIv1"]["config"]["Labels"]
    else:
        inspected = json.loads(run(["docker", "image", "inspect", image], timeout=60).stdout)
        labels = inspected[0]["Config"]["Labels"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert labels["org.opencontainers.image.revision"].removesuffix("-dirty") == head
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.created"].endswith("Z")
    spec_dir, results = tmp_path / "spec", tmp_path / "results"
    spec_dir.mkdir()
    results.mkdir(mode=0o777)
    results.chmod(0o777)  # the pod's emptyDir is writable by the pod's user
    spec = tiny_spec(strategy="zero3", steps=4, warmup_steps=1)
    (spec_dir / "spec.json").write_text(spec.dumps())
    # The Kubernetes Job's environment for one node of two ranks (pytest_llmbench/k8s_templates/job.yaml.j2).
    env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0",
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29531", "LLMBENCH_RUN_ID": "image-test",
           "DS_ACCELERATOR": "cpu"}
    # The Job's command and args, as the pod runs them.
    command = ["python", "-m", "torch.distributed.run", "-m", "harness", "--spec", "/etc/llmbench/spec.json",
               "--out", "/results/result.json", "--run-id", "image-test"]
    probe = ("id -u; command -v gcc cc g++ c++ clang nvcc || echo no-compiler; "
             "test -e /tmp/wheelhouse || echo no-wheels")
    mounts = ["-v", f"{spec_dir}:/etc/llmbench:ro", "-v", f"{results}:/results"]
    envs = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    if tool == "buildah":
        container = run(["buildah", "from", "-q", image], timeout=120).stdout.strip()
        try:
            inside = run(["buildah", "run", "--isolation", "chroot", container, "--", "sh", "-c", probe],
                         timeout=120).stdout
            log = run(offline(["buildah", "run", "--isolation", "chroot", *mounts, *envs, container, "--",
                               *command]), timeout=300).stdout
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True)
    else:
        inside = run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", probe], timeout=120).stdout
        log = run(["docker", "run", "--rm", "--network", "none", *mounts, *envs, "--entrypoint", "python",
                   image, *command[1:]], timeout=300).stdout
    uid, compilers, wheels = inside.splitlines()[:3]
    assert uid == "1000"  # the image's own USER, which the Job's runAsNonRoot checks
    assert compilers == "no-compiler"
    assert wheels == "no-wheels"  # the wheelhouse stayed in the build stage
    # Read as the Kubernetes launcher reads a pod: the marked result in the log.
    result = extract_marked(log)
    assert result is not None, log[-2000:]
    assert result.status == "ok", result.error
    assert (result.case_id, result.spec.strategy, result.spec.world_size) == ("zero3-ws2-seq64", "zero3", 2)
    assert result.env["deepspeed"] == "0.19.8" and result.env["torch"].startswith("2.13.0")
    assert len(result.step_times_s) == spec.steps - spec.warmup_steps
    assert json.loads((results / "result.json").read_text())["case_id"] == "zero3-ws2-seq64"



@pytest.fixture(scope="module")
def real_node(harness_image, tmp_path_factory):
    """The control plane of tests/k8s (Kueue's, JobSet's and Trainer's controllers too) and one real node
    (tools/k8s_kubelet.py: the upstream kubelet, containerd, runc, the CNI bridge, CoreDNS) with the image
    just built imported into its containerd. Stopped, with everything it started, when the module ends."""
    tool, image = harness_image
    cache, problem = k8s_local.cached(), k8s_kubelet.missing()
    node_cache = k8s_kubelet.build_node(cached_only=True)
    if problem or cache is None or node_cache is None or tool != "buildah":
        reason = problem or ("the node needs buildah's image store" if tool != "buildah" else
                             "the control plane or the node is not built: make cluster-build node-build")
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"no real node here: {reason}")
    root = tmp_path_factory.mktemp("real-node")
    cluster = k8s_local.LocalKube(root / "kube", cache, controllers=("kueue", "jobset", "trainer"), nodes=0)
    node = k8s_kubelet.RealNode(cluster, root / "node", node_cache)
    try:
        cluster.start()
        node.start()
        node.load_image(image)
        yield cluster, node, image
    finally:
        node.stop()
        cluster.stop()
    # nothing the node started is left: no process of its containerd (shims included), no bridge
    assert subprocess.run(["pgrep", "-f", str(node.sock)], capture_output=True).stdout == b""
    assert subprocess.run(["ip", "link", "show", k8s_kubelet.BRIDGE], capture_output=True).returncode != 0


@pytest.mark.image
@pytest.mark.parametrize("kind", ["job", "jobset", "trainjob"])
def test_a_real_kubelet_runs_the_launchers_two_pod_case_of_each_kind(real_node, tmp_path, kind):
    """The k8s launcher's case end to end with nothing emulated: two pods of one rank each, containers of
    the image on a real kubelet. The Job is the launcher's; the JobSet's pods and Service are JobSet's
    controller's; the TrainJob is rendered into that JobSet by Trainer's controller, which sets PET_*.
    Rank 1 finds rank 0 by the name CoreDNS answers from the EndpointSlice of the run's headless Service,
    and the launcher reads the result from the pods' logs through the API server and the kubelet."""
    node = real_node[1]
    run_id = f"kubelet-{kind}-1"
    result = _kubelet_case(real_node, tmp_path, run_id, kind=kind)
    assert result.status == "ok", f"{result.status}: {result.error}\n{result.log_tail}"
    assert result.env["nnodes"] == 2
    assert len(result.step_times_s) == result.spec.steps - result.spec.warmup_steps
    name = object_name(run_id)
    rank0 = f"{name}-0.{name}" if kind == "job" else f"{name}-node-0-0.{name}"  # JobSet's names
    asked = f'"A IN {rank0}.{k8s_local.NAMESPACE}.svc.cluster.local.'
    dns = (node.root / "logs" / "coredns.log").read_text(errors="replace")
    assert [line for line in dns.splitlines() if asked in line and " NOERROR " in line], dns[-3000:]
    end = time.monotonic() + 60  # the launcher deleted its owner; the garbage collector and kubelet follow
    while node.pods() and time.monotonic() < end:
        time.sleep(1)
    assert node.pods() == []


def _kubelet_case(real_node, tmp_path, run_id, *, kind="job", fault=None, timeout_s=300.0, placement=None):
    """The launcher's two-pod case (ws2, one rank a pod) on the real node, as ``kind``; ``placement``:
    the profile's [k8s] table (a Kueue queue)."""
    cluster, node, image = real_node
    launcher = K8sLauncher(namespace=k8s_local.NAMESPACE, image=image,
                           kubeconfig=str(cluster.launcher_kubeconfig), poll_s=0.5)
    launcher.kind = kind
    launcher.placement = placement or {}
    spec = RunSpec.from_preset("tiny", strategy="ddp", world_size=2, nnodes=2, micro_batch=4, grad_accum=2,
                               seq_len=64, steps=3, warmup_steps=1, threads_per_rank=1, data_pool=16)
    return launcher.run(spec, run_dir=tmp_path / "run", run_id=run_id, timeout_s=timeout_s,
                        env={"DS_ACCELERATOR": "cpu", **({"LLMBENCH_FAULT": fault} if fault else {})},
                        progress=lambda line: None)


@pytest.mark.image
def test_on_a_real_kubelet_a_failed_rank_is_blamed_a_hang_times_out_and_a_lost_pod_is_named(real_node,
                                                                                              tmp_path):
    """What tests/k8s shows on the emulated node agent, held to the real kubelet: its exit codes, its
    SIGTERM on deletion and on the Job's deadline, and its removal of the containers."""
    cluster, node, _ = real_node
    failed = _kubelet_case(real_node, tmp_path / "raise", "kubelet-raise-1", fault="1:raise")
    assert failed.status == "error" and failed.failed_rank == 1, failed.error
    assert "injected failure on rank 1" in failed.error and "--- pod 1 ---" in failed.log_tail

    hung = _kubelet_case(real_node, tmp_path / "hang", "kubelet-hang-1", fault="1:hang", timeout_s=30)
    assert hung.status == "timeout" and "no result after 30 s" in hung.error, hung.error

    def delete_a_pod():  # someone else's deletion mid-run (an admin, a drain): the kubelet's SIGTERM
        end = time.monotonic() + 90
        while time.monotonic() < end:
            running = running_pods(cluster, "kubelet-lost-1", k8s_local.NAMESPACE)
            if len(running) == 2:
                time.sleep(3)
                cluster.kubectl("delete", "pod", "-n", k8s_local.NAMESPACE, running[1]["metadata"]["name"],
                                "--wait=false")
                return
            time.sleep(0.5)

    thread = threading.Thread(target=delete_a_pod)
    thread.start()
    lost = _kubelet_case(real_node, tmp_path / "lost", "kubelet-lost-1", fault="0:hang")
    thread.join()
    assert lost.status == "error"
    assert "was deleted while it ran" in lost.error or "disappeared" in lost.error, lost.error
    end = time.monotonic() + 60
    while node.pods() and time.monotonic() < end:
        time.sleep(1)
    assert node.pods() == [] and node.sandboxes() == []  # the kubelet removed every container


@pytest.mark.image
def test_on_a_real_kubelet_kueue_admits_a_queued_case_under_quota(real_node, tmp_path):
    """Kueue's own admission (tests/k8s's quota): the case's Job waits suspended until Kueue admits its
    Workload and resumes it, then its pods run on the real node."""
    cluster, node, _ = real_node
    cluster.apply(QUOTA)
    with workloads_seen(cluster, k8s_local.NAMESPACE) as seen:
        result = _kubelet_case(real_node, tmp_path, "kubelet-queued-1",
                               placement={"queue": "team-a", "queue_timeout_s": 120})
    assert result.status == "ok", f"{result.status}: {result.error}"
    ran = admitted(seen)
    assert ran and ran[0]["status"]["admission"]["clusterQueue"] == "benchmarks"
    end = time.monotonic() + 60
    while node.pods() and time.monotonic() < end:
        time.sleep(1)
    assert node.pods() == [] and node.sandboxes() == []


@pytest.mark.image
def test_on_a_real_kubelet_kueue_preempts_a_running_case_for_a_higher_priority_job(real_node, tmp_path):
    """Kueue's own preemption with real pods: a ClusterQueue with room for one case, the case's two pods
    running on the node, then a Job of a higher WorkloadPriorityClass queued for the same quota. Kueue
    evicts the case's Workload and suspends its Job again, the Job controller deletes its pods (real
    containers, SIGTERM), and the launcher records Kueue's reason instead of waiting or re-running."""
    cluster, node, image = real_node
    cluster.apply(QUOTA)
    run_id = "kubelet-preempted-1"
    # tests/k8s's urgent Job, as a container of the image the node holds
    urgent = URGENT.replace("image: x\n", f"image: {image}\n          imagePullPolicy: Never\n")
    assert f"image: {image}" in urgent
    stop = threading.Event()

    def submit_urgent():  # once this case's own pods run (pods of earlier cases may still be terminating)
        end = time.monotonic() + 180
        while not stop.is_set() and time.monotonic() < end:
            if len(running_pods(cluster, run_id, k8s_local.NAMESPACE)) == 2:
                cluster.apply(urgent)
                return
            time.sleep(0.3)

    thread = threading.Thread(target=submit_urgent)
    thread.start()
    try:
        result = _kubelet_case(real_node, tmp_path, run_id, fault="0:hang",
                               placement={"queue": "team-c", "queue_timeout_s": 120})
    finally:
        stop.set()
        thread.join()
        cluster.kubectl("delete", "job", "urgent", "-n", k8s_local.NAMESPACE, "--ignore-not-found",
                        "--wait=false")
    log = cluster.logs / "kueue.log"
    kueue = log.read_text(errors="replace") if log.exists() else ""
    assert result.status == "error", f"{result.status}: {result.error}\n{kueue[-4000:]}"
    evicted_not_rerun(result, "Preempted: ")
    end = time.monotonic() + 90
    while node.pods() and time.monotonic() < end:
        time.sleep(1)
    assert node.pods() == [] and node.sandboxes() == []
