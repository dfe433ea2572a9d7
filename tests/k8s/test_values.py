"""No value reaches a manifest unchecked: rules where values enter, tojson where they are
written. (Before: a pull secret 's}, {name: other' added a second imagePullSecret, an env key
added an env var of its own, a namespace with a newline sent objects elsewhere.)"""

import jinja2
import pytest
from jinja2 import nodes

from pytest_llmbench.launchers.k8s import values as k8s_values
from pytest_llmbench.launchers.k8s.manifests import TEMPLATES, Placement, render_case, render_setup
from tests.k8s.conftest import two_node_spec

HOSTILE_SECRET = "s}, {name: other"
HOSTILE_ENV = "X, value: x}\n            - {name: INJECTED"
HOSTILE_NAMESPACE = "llmbench\nnamespace: kube-system"


def test_every_template_value_is_written_through_tojson():
    env = jinja2.Environment()
    for template in sorted(TEMPLATES.glob("*.j2")):
        tree = env.parse(template.read_text())
        for output in tree.find_all(nodes.Output):
            for node in output.nodes:
                if isinstance(node, nodes.TemplateData):
                    continue
                assert isinstance(node, nodes.Filter) and node.name == "tojson", (
                    f"{template.name}:{node.lineno}: a value written without tojson")


def test_unchecked_hostile_values_stay_single_scalars():
    """Even past the checks (a Placement built by hand), each value is one YAML scalar."""
    where = Placement(image="img:1", namespace=HOSTILE_NAMESPACE, pull_secret=HOSTILE_SECRET)
    objects = render_case(two_node_spec(), run_id="r-1", placement=where, env={HOSTILE_ENV: "v"},
                          timeout_s=60)
    assert [o["metadata"]["namespace"] for o in objects] == [HOSTILE_NAMESPACE] * 4
    pod = objects[0]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": HOSTILE_SECRET}]
    env = pod["containers"][0]["env"]
    assert [e for e in env if e["name"] not in (HOSTILE_ENV,) and "INJECTED" in e["name"]] == []
    assert {"name": HOSTILE_ENV, "value": "v"} in env
    setup = render_setup(HOSTILE_NAMESPACE)
    assert [o["metadata"]["namespace"] for o in setup[1:]] == [HOSTILE_NAMESPACE] * 3


@pytest.mark.parametrize("check, good, bad", [
    (k8s_values.dns_label, ["llmbench", "a", "team-1"], ["Bench", "-a", "a-", "a.b", "a\nb", "x" * 64, ""]),
    (k8s_values.dns_subdomain, ["regcred", "my.secret-1"], [HOSTILE_SECRET, "a..b", "A", "x" * 254]),
    (k8s_values.env_name, ["NCCL_IB_DISABLE", "_X", "x1"], [HOSTILE_ENV, "1X", "A-B", "A=B", ""]),
    (k8s_values.qualified_name, ["nvidia.com/gpu", "node.kubernetes.io/instance-type", "zone"],
     ["nvidia.com/", "/gpu", "a/b/c", "x y", "UPPER.com/x"]),
    (k8s_values.label_value, ["VM.GPU.A10.1", "", "a_b-c"], ["-x", "x y", "x" * 64, "a\nb"]),
    (k8s_values.quantity, ["8", "500m", "48Gi", "1.5G", "1e3", 2], ["8 Gi", "-1", "lots", "1Gb", True]),
    (k8s_values.image, ["llmbench/harness:0.1", "reg.example.com:5000/a/b@sha256:" + "0" * 64, "ubuntu"],
     ["Reg/UPPER:1", "a b", "img:tag\nx", "img@sha256:xyz", ""]),
])
def test_rules(check, good, bad):
    assert [v for v in good if check(v)] == []
    assert [v for v in bad if not check(v)] == []


@pytest.mark.parametrize("table, message", [
    ({"node_selector": {"zone": "a b"}}, "key 'k8s.node_selector.zone': 'a b' must be a label value"),
    ({"node_selector": {"bad key!": "x"}},
     """key 'k8s.node_selector."bad key!"': 'bad key!' must be a qualified"""),
    ({"memory": "48 GiB"}, "key 'k8s.memory': '48 GiB' must be a Kubernetes resource quantity"),
    ({"extra_resources": {"rdma/ib": "one"}}, "'one' must be a Kubernetes resource quantity"),
    ({"tolerations": [{"key": "x", "effect": "Never"}]}, "key 'k8s.tolerations[0]'"),
    ({"gpu_resource": "nvidia.com/gpu\n"}, "key 'k8s.gpu_resource'"),
    ({"queue": "Team_A"}, "key 'k8s.queue': 'Team_A' must be a DNS-1123 subdomain"),
    ({"queue": "q" * 64}, "must be at most 63 characters (it is the value of the kueue.x-k8s.io/queue-name"),
    ({"priority_class": "High Priority"}, "key 'k8s.priority_class': 'High Priority' must be a DNS-1123"),
    ({"queue_timeout_s": 0}, "key 'k8s.queue_timeout_s': 0 must be a finite positive number of seconds"),
    ({"labels": {"team": "ml infra"}}, "key 'k8s.labels.team': 'ml infra' must be a label value"),
    ({"labels": {"llmbench.dev/run": "x"}},
     "key 'k8s.labels.\"llmbench.dev/run\"': 'llmbench.dev/run' is set by the launcher itself"),
    ({"labels": {"kueue.x-k8s.io/queue-name": "q"}}, "(the queue by the k8s.queue key)"),
    ({"annotations": {"note": 3}}, "key 'k8s.annotations.note': 3 must be a string"),
    ({"annotations": {"a": "x" * 300_000}}, "'300001 bytes' must total at most 262144 bytes"),
    ({"labels": ["team=ml"]}, "key 'k8s.labels': ['team=ml'] must be a table of label keys to values"),
])
def test_a_bad_placement_value_names_the_file_key_and_rule(table, message):
    from pytest_llmbench.launchers.k8s.manifests import PlacementError

    with pytest.raises(PlacementError, match=None) as info:
        Placement.from_profile(table, source="mine.toml", image="img:1")
    assert str(info.value).startswith("profile mine.toml: ") and message in str(info.value)


@pytest.mark.parametrize("args, env, message", [
    (["--llmbench-k8s-pull-secret", HOSTILE_SECRET], {},
     "command line --llmbench-k8s-pull-secret: 's}, {name: other' is not a valid secret name: it must be "
     "a DNS-1123 subdomain"),
    ([], {"LLMBENCH_K8S_NAMESPACE": "bench\nother"},
     "environment LLMBENCH_K8S_NAMESPACE: 'bench\\nother' is not a valid namespace: "
     "it must be a DNS-1123 label"),
    (["--llmbench-k8s-image", "Registry/Harness:latest"], {},
     "command line --llmbench-k8s-image: 'Registry/Harness:latest' is not a valid image reference"),
])
def test_bad_k8s_settings_are_usage_errors_naming_their_source(pytester, monkeypatch, args, env, message):
    pytester.makepyfile(test_x="def test_x(): pass")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_a_bad_profile_env_key_or_k8s_value_names_the_file_and_key(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    base = ('device = "cpu"\ndtype = "fp32"\nmodel = "tiny"\nmicro_batch = 1\ngrad_accum = 1\n'
            'steps = 3\nwarmup_steps = 1\nstrategies = ["ddp"]\nworld_sizes = [1]\nseq_lens = [64]\n')
    (pytester.path / "mine.toml").write_text(base + '[env]\n"X, value: x}" = "1"\n')
    result = pytester.runpytest_subprocess("--llmbench-profile-file=mine.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("""profile file mine.toml: key 'env."X, value: x}"': 'X, value: x}' must be an environment """
            "variable name") in result.stderr.str()
    (pytester.path / "mine.toml").write_text(base + '[k8s]\nnode_selector = { zone = "eu 1" }\n')
    result = pytester.runpytest_subprocess("--llmbench-profile-file=mine.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "profile file mine.toml: key 'k8s.node_selector.zone': 'eu 1' must be a label value" in \
        result.stderr.str()
