"""Every template rendered for every profile, validated against the Kubernetes schemas."""

import kubernetes_validate
import pytest
import yaml

from harness.spec import RunSpec
from pytest_llmbench.cases import make_spec
from pytest_llmbench.launchers.k8s import manifests as k8s_manifests
from pytest_llmbench.launchers.k8s.manifests import (
    Placement,
    PlacementError,
    object_name,
    owned_by,
    render_case,
    render_setup,
)
from pytest_llmbench.profiles import load_profiles
from tests.k8s.conftest import two_node_spec

K8S_VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]
PROFILES = load_profiles()
IMAGE = "registry.example.com/llmbench/harness@sha256:" + "0" * 64


def rendered(profile_name: str, world_size: int | None = None):
    profile = PROFILES[profile_name]
    ws = world_size or max(profile.world_sizes)
    spec = make_spec(profile, profile.strategies[-1], ws, profile.seq_lens[0])
    placement = Placement.from_profile(profile.launch["k8s"], source=profile.source, image=IMAGE,
                                       pull_secret="registry-secret")
    run_id = f"{profile_name}-{spec.case_id}-0a1b2c"
    return spec, render_case(spec, run_id=run_id, placement=placement, env=profile.env, timeout_s=1800)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_case_objects_are_valid_kubernetes(profile, version):
    _, objects = rendered(profile)
    assert [o["kind"] for o in objects] == ["Job", "ConfigMap", "Service", "NetworkPolicy"]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_setup_objects_are_valid_kubernetes(version):
    objects = render_setup("llmbench")
    assert [o["kind"] for o in objects] == ["Namespace", "ServiceAccount", "Role", "RoleBinding"]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_setup_command_prints_the_setup_objects_for_kubectl(capsys):
    assert k8s_manifests.main(["setup", "--namespace", "bench"]) == 0
    printed = [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]
    assert printed == render_setup("bench")
    with pytest.raises(SystemExit) as exit_info:
        k8s_manifests.main(["setup", "--namespace", "Not_A_Label"])
    assert exit_info.value.code == 2
    assert "'Not_A_Label': must be a DNS-1123 label" in capsys.readouterr().err


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_a_queued_case_is_valid_kubernetes_and_carries_its_queue(version):
    """Kueue's label on the Job (not its pods: Kueue reads the Job's), the profile's labels on every
    object and pod, its annotations and PriorityClass on the Job's pods."""
    spec = two_node_spec()
    placement = Placement.from_profile({"queue": "team-a", "priority_class": "benchmarks",
                                        "labels": {"cost-center": "ml-42"},
                                        "annotations": {"example.com/ticket": "BENCH-7"}},
                                       source="mine.toml", image=IMAGE)
    objects = render_case(spec, run_id="q-1", placement=placement, env={}, timeout_s=60)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    job, pod = objects[0], objects[0]["spec"]["template"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    assert [o["metadata"]["labels"]["cost-center"] for o in objects] == ["ml-42"] * 4
    assert pod["metadata"]["labels"]["cost-center"] == "ml-42"
    assert pod["metadata"]["annotations"] == {"example.com/ticket": "BENCH-7"}
    assert pod["spec"]["priorityClassName"] == "benchmarks"
    owned = owned_by(objects[1], {**job, "metadata": {**job["metadata"], "uid": "0-1"}})
    kubernetes_validate.validate(owned, version, strict=True)
    assert owned["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job",
                                                     "name": job["metadata"]["name"], "uid": "0-1",
                                                     "controller": True}]


def test_strict_schema_validation_catches_a_typo():
    _, objects = rendered("a10")
    job = objects[0]
    job["spec"]["parallelizm"] = 2
    with pytest.raises(kubernetes_validate.ValidationError, match="parallelizm"):
        kubernetes_validate.validate(job, "1.33.0", strict=True)


def test_one_indexed_job_per_case_with_the_trainer_environment():
    spec, objects = rendered("a10", world_size=4)
    job = objects[0]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == spec.nnodes == 4
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 1830 and job["spec"]["ttlSecondsAfterFinished"] > 0
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}}
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    name = job["metadata"]["name"]
    assert env["PET_NNODES"]["value"] == "4" and env["PET_NPROC_PER_NODE"]["value"] == "1"
    assert env["PET_MASTER_ADDR"]["value"] == f"{name}-0.{objects[2]['metadata']['name']}"
    assert env["PET_MASTER_PORT"]["value"] == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["NCCL_IB_DISABLE"]["value"] == "1"  # A10 shapes have no InfiniBand
    assert pod["subdomain"] == objects[2]["metadata"]["name"]
    assert objects[2]["spec"]["clusterIP"] == "None"
    assert job["spec"]["suspend"] is True  # resumed once what it owns exists (launchers/k8s/launcher.py)
    configmap = objects[1]
    assert RunSpec.from_dict(__import__("json").loads(configmap["data"]["spec.json"])) == spec


def test_security_defaults():
    _, objects = rendered("h100", world_size=8)  # one node: no RDMA, the restricted pod
    pod = objects[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostNetwork"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/results", "/tmp", "/dev/shm"}
    assert container["image"] == IMAGE and pod["imagePullSecrets"] == [{"name": "registry-secret"}]
    policy = objects[3]
    run = {"llmbench.dev/run": objects[0]["metadata"]["name"]}
    assert policy["spec"]["podSelector"]["matchLabels"] == run
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": run}}]}]


def test_a_case_that_spans_nodes_gets_the_shapes_rdma_as_ocis_manifests_do():
    """h100 at ws16 (two BM.GPU.H100.8 nodes): host network, the node's /dev/infiniband, a
    privileged container with IPC_LOCK, the shape's NCCL_IB_HCA and OCI's RoCE settings under the
    profile's own [env] (oci-hpc-oke manifests/nccl-tests/host-network/kueue/BM.GPU.H100.8.yaml);
    valid against the schemas with every other profile (test_case_objects_are_valid_kubernetes)."""
    spec, objects = rendered("h100", world_size=16)
    assert spec.nnodes == 2
    pod = objects[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True,
                                            "capabilities": {"add": ["IPC_LOCK"]}}
    # root, as Oracle's manifests: IPC_LOCK added to a non-root container is not effective (k8s#56374)
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsNonRoot"]) == (0, False)
    assert {"name": "devinf", "mountPath": "/dev/infiniband"} in container["volumeMounts"]
    assert {"name": "devinf", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}} in pod["volumes"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_IB_HCA"].startswith("=mlx5_0,mlx5_1,mlx5_3") and env["NCCL_IB_HCA"].count("mlx5") == 16
    assert (env["NCCL_IB_GID_INDEX"], env["NCCL_IB_TC"], env["NCCL_CUMEM_ENABLE"]) == ("3", "41", "0")
    assert env["NCCL_NET_GDR_LEVEL"] == "PHB"  # the profile's own [env] stays
    for kind in ("a10", "l40s"):  # single-GPU VMs and shapes without the table's RDMA keep the pod
        pod = rendered(kind)[1][0]["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is False and "NCCL_IB_HCA" not in str(pod)
        assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"]
    with pytest.raises(PlacementError, match=r"k8s.rdma': 'BM.GPU.X' is not an RDMA shape"):
        Placement.from_profile({"rdma": "BM.GPU.X"}, source="mine.toml", image=IMAGE)


def test_gpu_placement_from_the_profile():
    _, objects = rendered("a10")
    pod = objects[0]["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1 == resources["requests"]["nvidia.com/gpu"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "VM.GPU.A10.1"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_every_object_is_tied_to_its_run_by_name_and_label():
    _, objects = rendered("h200")
    name = objects[0]["metadata"]["name"]
    for obj in objects:
        assert obj["metadata"]["name"] == name
        assert obj["metadata"]["labels"]["llmbench.dev/run"] == name


def test_names_are_dns_safe_and_short():
    name = object_name("H100-ZeRO3-ws16-seq32768_" + "x" * 80)
    assert len(name) <= 52 and name == name.lower()
    assert all(c.isalnum() or c == "-" for c in name) and not name.endswith("-")


def test_host_network_must_say_why():
    with pytest.raises(PlacementError, match="host_network_reason"):
        Placement.from_profile({"host_network": True}, source="mine.toml", image=IMAGE)
    with pytest.raises(PlacementError, match="'k8s.gpus'"):
        Placement.from_profile({"gpus": 8}, source="mine.toml", image=IMAGE)


def test_a_value_outside_the_bmp_reaches_the_pod_as_the_character_the_profile_holds():
    """An emoji in a profile's [env] arrived as two lone surrogate halves (issue 49), which the
    client cannot even encode to send; the ConfigMap's spec, the labels and the C1 controls json
    escapes stay as they were."""
    profile = PROFILES["a10"]
    spec = make_spec(profile, profile.strategies[-1], 2, profile.seq_lens[0])
    placement = Placement.from_profile(profile.launch["k8s"], source=profile.source, image=IMAGE)
    env = {"RUN_NOTE": "GPU \U0001f680 caf\u00e9 \u0085 \U00010348"}
    objects = render_case(spec, run_id="a10-x-0a1b2c", placement=placement, env=env, timeout_s=60)
    container = objects[0]["spec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod_env["RUN_NOTE"] == env["RUN_NOTE"]
    assert pod_env["RUN_NOTE"].encode("utf-8")  # what the API client sends: no lone surrogate


def test_a_compile_case_is_refused_in_pods_unless_the_profile_says_the_image_compiles(tmp_path):
    """torch.compile needs a C compiler and Python.h at its first step (Triton's launcher on CUDA,
    inductor's C++ kernels on CPU); the project's images have neither (tests/unit/test_image.py), so a
    `compile` case is refused before anything is created, by name, in a dry run and in a run, and runs
    where the profile's k8s.image_compiler says the image has them. No cluster is reached: the
    kubeconfig named does not exist, so a refusal that came after a create would fail differently."""
    from pytest_llmbench.launchers.k8s.launcher import K8sLauncher

    spec = two_node_spec().replace(variant="compile")
    launcher = K8sLauncher(namespace="llmbench", image=IMAGE, kubeconfig=str(tmp_path / "absent"),
                           placement_source="profiles/x.toml")
    files = launcher.preview(spec, run_id="r-1", timeout_s=60, env={}, run_dir=tmp_path)
    assert list(files) == ["CANNOT-RUN.txt"]
    assert "profiles/x.toml: variant 'compile'" in files["CANNOT-RUN.txt"]
    assert "k8s.image_compiler = true" in files["CANNOT-RUN.txt"]
    result = launcher.run(spec, run_dir=tmp_path / "run", run_id="r-1", timeout_s=60, env={},
                          progress=lambda line: None)
    assert result.status == "error" and "C compiler and Python.h" in result.error
    assert not (tmp_path / "run").exists()  # refused before anything was written or created
    launcher.placement = {"image_compiler": True}
    assert list(launcher.preview(spec, run_id="r-1", timeout_s=60, env={}, run_dir=tmp_path)) == [
        "manifests.yaml"]
    launcher.placement = {"image_compiler": "yes"}  # a boolean, as every other switch
    with pytest.raises(PlacementError, match="k8s.image_compiler"):
        launcher.preview(spec, run_id="r-1", timeout_s=60, env={}, run_dir=tmp_path)
