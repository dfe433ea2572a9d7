"""One planner (issue 43): the report's "Does it fit?" for a GPU profile is what ``llmbench-plan --profile
NAME --model MODEL`` prints, for every plan model of every GPU profile: the same activations (measured on
that model's own architecture under FakeTensorMode at the profile's precision, where the report once
carried the profile's gpt2-350m activations to every plan model), the same terms, N and verdicts."""

import json

import pytest

from pytest_llmbench.planner import profile_plan
from pytest_llmbench.planner.cli import main
from pytest_llmbench.profiles import load_profiles

GPU_PROFILES = [p for p in load_profiles([]).values() if p.device != "cpu"]


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_does_it_fit_is_llmbench_plan_profile(profile, capsys):
    scale = profile_plan.for_profile(profile, [], runtime=False)  # what the report asks the planner
    assert scale.rows and scale.measured_models, profile.name
    for model in profile.plan_models or (profile.model,):
        for workload in profile.workloads:
            name = model if workload == "pretrain" else f"{model} {workload}"
            report = {r["strategy"]: r for r in scale.rows if r["model"] == name}
            assert main(["--profile", profile.name, "--model", model, "--workload", workload, "--json"]) == 0
            doc = json.loads(capsys.readouterr().out)
            assert doc["precision"] == profile.dtype
            cli = {p["strategy"]: p for p in doc["plans"]}
            assert set(cli) == set(report), (profile.name, name)
            for strategy, row in report.items():
                gib = {int(n): w["total_bytes"] / 2**30 for n, w in cli[strategy]["world_sizes"].items()}
                assert gib == pytest.approx(row["memory"], rel=1e-12), (profile.name, name, strategy)
                assert cli[strategy]["fits_from"] == row["fits_from"], (profile.name, name, strategy)
            assert any(name in line and "activations measured on" in line for line in scale.lines)
