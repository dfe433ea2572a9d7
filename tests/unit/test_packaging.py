"""Installed from a wheel, the plugin still finds its templates.

The Kubernetes templates live in pytest_llmbench/k8s_templates/ and the report's parts in
pytest_llmbench/report/templates/, inside the package (no links: a link in a wheel's sources is copied
or not by the build tool's whim), and pyproject's package-data must name them.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_llmbench"


def package_data() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]["pytest_llmbench"]


def test_the_templates_are_folders_of_the_package_not_links():
    links = [p for p in PACKAGE.rglob("*") if p.is_symlink()]
    assert links == []
    assert (PACKAGE / "k8s_templates" / "job.yaml.j2").is_file()


def test_package_data_ships_every_template():
    from pytest_llmbench import report

    shipped = {p.resolve() for pattern in package_data() for p in PACKAGE.glob(pattern)}
    templates = {*(PACKAGE / "k8s_templates").glob("*.j2"),
                 *(PACKAGE / "report" / "templates").glob("**/*.j2")}
    assert len(templates) == 3 + len(report.SECTIONS)  # the manifests, each report section's part
    assert templates <= shipped


def test_the_code_loads_templates_through_the_package():
    from pytest_llmbench.launchers.k8s import manifests as k8s_manifests
    from pytest_llmbench.report import build as report

    assert k8s_manifests.TEMPLATES.resolve() == PACKAGE / "k8s_templates"
    assert report.TEMPLATES.resolve() == PACKAGE / "report" / "templates"


def test_the_train_extra_admits_no_torch_or_deepspeed_the_code_cannot_run():
    """A GPU host brings its own torch (`pip install '.[train]'`): the extra's floors are what the
    code imports and configures (torch 2.6: public fully_shard, MixedPrecisionPolicy,
    CPUOffloadPolicy; DeepSpeed 0.19: torch_autocast, engine.destroy), and admit the tested pins."""
    from packaging.requirements import Requirement

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = config["project"]["optional-dependencies"]["train"]
    train = {r.name: r.specifier for r in map(Requirement, extra)}
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split()
                if "==" in line and not line.startswith("#"))
    for name, too_old, floor in (("torch", "2.5.1", "2.6.0"), ("deepspeed", "0.18.9", "0.19.0")):
        assert not train[name].contains(too_old) and train[name].contains(floor), (name, train[name])
        assert train[name].contains(pins[name].split("+")[0]), (name, pins[name])
    from harness.parallel import fsdp  # the imports the torch floor stands for

    assert fsdp.fully_shard and fsdp.MixedPrecisionPolicy and fsdp.CPUOffloadPolicy


def test_the_plugin_loads_without_the_reports_or_the_trainings_libraries():
    """pytest imports the plugin in every run of an environment that has it (``pytest --help``, any
    other project's tests): its import pulls no torch, DeepSpeed, scipy, pandas or matplotlib
    (together ~4 s on a 2-core machine). They load when a case runs or a report is built."""
    import subprocess
    import sys

    heavy = ("torch", "deepspeed", "scipy", "pandas", "matplotlib", "transformers")
    probe = ("import sys, pytest_llmbench.plugin, pytest_llmbench.report, pytest_llmbench.report.sections; "
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
