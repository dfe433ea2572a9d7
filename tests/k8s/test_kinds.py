"""``--llmbench-k8s-kind jobset|trainjob`` (launchers/k8s/kinds.py): every profile's cases validated
against the JobSet and TrainJob CRDs' published schemas (tests/k8s/crds/, strict: an unknown field is
an error), and a case of each run end to end against the real control plane."""

import gzip
import json
import threading
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from pytest_llmbench.cases import make_spec
from pytest_llmbench.launchers.k8s.kinds import KindError, as_kind
from pytest_llmbench.launchers.k8s.manifests import Placement, object_name, render_case
from pytest_llmbench.profiles import load_profiles
from tests.k8s.conftest import launch

CRDS = Path(__file__).resolve().parent / "crds"
SCHEMAS = {"JobSet": "jobset.x-k8s.io_jobsets.v1alpha2.json.gz",
           "TrainJob": "trainer.kubeflow.org_trainjobs.v1alpha1.json.gz"}
PROFILES = load_profiles()
IMAGE = "registry.example.com/llmbench/harness@sha256:" + "0" * 64


def strict(schema):
    """The CRD's schema as the API server's strict field validation applies it: no field it does not
    name, where it names its fields and does not preserve unknown ones."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return [strict(v) for v in schema] if isinstance(schema, list) else schema


def _validator(name: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(json.loads(gzip.decompress((CRDS / name).read_bytes()))))


VALIDATORS = {kind: _validator(name) for kind, name in SCHEMAS.items()}


def validate(obj):
    if obj["kind"] in VALIDATORS:
        VALIDATORS[obj["kind"]].validate(obj)
    else:
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


def rendered(profile, ws, kind):
    spec = make_spec(profile, profile.strategies[-1], ws, profile.seq_lens[0])
    placement = Placement.from_profile(profile.launch["k8s"], source=profile.source, image=IMAGE,
                                       pull_secret="registry-secret")
    objects = render_case(spec, run_id=f"{profile.name}-{spec.case_id}-0a1b2c", placement=placement,
                          env=profile.env, timeout_s=1800)
    return spec, as_kind(objects, kind, spec=spec)


@pytest.mark.parametrize("kind", ["jobset", "trainjob"])
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_case_validates_against_the_crd_schema(profile, kind):
    profile = PROFILES[profile]
    for ws in profile.world_sizes:
        try:
            spec, objects = rendered(profile, ws, kind)
        except KindError as exc:  # a TrainJob cannot carry the RDMA host network of a case across nodes
            assert kind == "trainjob" and "k8s.host_network or k8s.rdma" in str(exc)
            continue
        assert objects[0]["kind"] == {"jobset": "JobSet", "trainjob": "TrainJob"}[kind]
        for obj in objects:
            validate(obj)


def test_the_strict_schema_catches_a_misspelt_field():
    _, objects = rendered(PROFILES["a10"], 2, "jobset")
    objects[0]["spec"]["replicatedJobs"][0]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        validate(objects[0])
    _, objects = rendered(PROFILES["a10"], 2, "trainjob")
    objects[0]["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(jsonschema.ValidationError, match="numNode"):
        validate(objects[0])


def test_a_trainjob_leaves_trainers_variables_to_trainer():
    spec, (owner, policy) = rendered(PROFILES["a10"], 4, "trainjob")
    trainer = owner["spec"]["trainer"]
    names = [e["name"] for e in trainer["env"]]
    assert not [n for n in names if n.startswith("PET_")]  # Trainer refuses a TrainJob that sets them
    assert json.loads(next(e["value"] for e in trainer["env"] if e["name"] == "LLMBENCH_SPEC_JSON")) == \
        json.loads(spec.dumps())
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 1
    assert owner["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    runtime = owner["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
    patched = runtime["template"]["spec"]["replicatedJobs"][0]
    assert patched["template"]["spec"]["template"]["spec"]["nodeSelector"] == \
        PROFILES["a10"].launch["k8s"]["node_selector"]
    # /dev/shm as a memory volume, as the Job's pods have it (the runtime's 64 MiB otherwise)
    pod = patched["template"]["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert pod["containers"] == [{"name": "node",
                                  "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"jobset.sigs.k8s.io/jobset-name":
                                                            owner["metadata"]["name"]}


@pytest.mark.parametrize("kind, owner", [("jobset", "JobSet"), ("trainjob", "TrainJob")])
def test_a_case_runs_end_to_end_as_each_kind(cluster, launcher, tmp_path, kind, owner):
    """The real JobSet controller makes the replicated Job and its Service (pods named
    ``<name>-node-0-0.<name>``); for a TrainJob, Trainer's own controller renders it on the
    torch-distributed runtime of its release into that JobSet and sets the PET_* variables."""
    launcher.kind = kind
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            out = cluster.kubectl("get", "pods,jobsets.jobset.x-k8s.io", "-n", "llmbench",
                                  "-o", "json").stdout
            seen.extend(json.loads(out)["items"])
            time.sleep(0.5)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        result = launch(launcher, tmp_path)
    finally:
        stop.set()
        thread.join()
    assert result.ok, result.describe_failure()
    assert result.env["nnodes"] == 2 and len(result.losses) == result.spec.steps
    manifests = (tmp_path / "run" / "manifests.yaml").read_text()
    assert f"kind: {owner}" in manifests
    pods = {p["metadata"]["name"]: p for p in seen if p["kind"] == "Pod"}
    name = object_name("k8s-case-abc123")
    assert {f"{name}-node-0-0", f"{name}-node-0-1"} <= {n.rsplit("-", 1)[0] for n in pods}, sorted(pods)
    jobsets = [j for j in seen if j["kind"] == "JobSet"]
    assert jobsets and jobsets[0]["metadata"]["name"] == name
    if kind == "trainjob":  # the JobSet is Trainer's, owned by the TrainJob
        assert jobsets[0]["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        env = {e["name"]: e.get("value") for p in pods.values() for e in p["spec"]["containers"][0]["env"]}
        assert env["PET_NNODES"] == "2" and env["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}"
        # Trainer applied the launcher's runtime patch: the pods have /dev/shm in memory
        mounts = {m["mountPath"] for p in pods.values() for m in p["spec"]["containers"][0]["volumeMounts"]}
        assert "/dev/shm" in mounts
