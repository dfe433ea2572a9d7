"""``--llmbench-k8s-kind jobset|trainjob`` (launchers/k8s_kinds.py): every profile's cases validated
against the JobSet and TrainJob CRDs' published schemas (tests/k8s/crds/, strict: an unknown field is
an error), and a case of each run end to end against the fake API server."""

import gzip
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from pytest_llmbench.cases import make_spec
from pytest_llmbench.launchers.k8s_kinds import KindError, as_kind
from pytest_llmbench.launchers.k8s_manifests import Placement, render_case
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
    assert policy["spec"]["podSelector"]["matchLabels"] == {"jobset.sigs.k8s.io/jobset-name":
                                                            owner["metadata"]["name"]}


@pytest.mark.parametrize("kind, owner", [("jobset", "JobSet"), ("trainjob", "TrainJob")])
def test_a_case_runs_end_to_end_as_each_kind(cluster, launcher, tmp_path, kind, owner):
    launcher.kind = kind
    result = launch(launcher, tmp_path)
    assert result.ok, result.describe_failure()
    assert result.env["nnodes"] == 2 and len(result.losses) == result.spec.steps
    created = cluster.created
    assert created[0]["kind"] == owner
    uid, name = created[0]["metadata"]["uid"], created[0]["metadata"]["name"]
    assert {o["metadata"]["ownerReferences"][0]["uid"] for o in created[1:]} == {uid}
    assert [m for m, p in cluster.requests if p.endswith(f"/{kind}s/{name}")][:1] == ["PATCH"]  # resumed
    assert cluster.objects == {} and cluster.live_processes() == []


def test_a_trainjob_reports_its_progress_to_trainer(cluster, launcher, tmp_path):
    """With Trainer's TrainJobStatus endpoint in the pod's environment (the fake injects it as Trainer's
    controller does), rank 0 posts 0% at the start and 100% with the headline metrics at the end,
    outside the measured steps, with the token file's bearer token (harness/trainer_status.py)."""
    cluster.faults["trainer_status"] = True
    launcher.kind = "trainjob"
    result = launch(launcher, tmp_path)
    assert result.ok, result.describe_failure()
    (posted,) = cluster.trainer_status.values()
    assert [p["trainerStatus"]["progressPercentage"] for p in posted] == [0, 100]
    assert {p["authorization"] for p in posted} == {"Bearer fake-trainer-token"}
    metrics = {m["name"]: float(m["value"]) for m in posted[1]["trainerStatus"]["metrics"]}
    assert metrics["tokens_per_s"] == pytest.approx(result.metrics["tokens_per_s"], rel=1e-5)
    assert "mfu" not in metrics  # no value on this CPU: not reported as 0
