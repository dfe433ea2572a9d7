"""The A/B sides (pytest_llmbench/ab.py): each kind parsed, made ready or refused with the option's
source and the reason, before any case runs; a ref's worktree imports that ref's harness and is
removed at the end; an env file's variables beat the shell's on that side's ranks only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmbench import ab
from pytest_llmbench.launchers import warm

WHERE = "command line --llmbench-ab"


def prepare(kind: str, value: str, tmp_path: Path, *, launcher: str = "local", on_host: bool = True):
    return ab.prepare(kind, value, where=WHERE, launcher=launcher, on_this_host=on_host, output=tmp_path,
                      session_id="20261127T000000Z-abcd")


@pytest.mark.parametrize("raw", ["HEAD~1", "ref=", "tag=v1", "=x"])
def test_a_side_is_kind_equals_value(raw):
    with pytest.raises(ab.SideError, match=f"{WHERE}: .* is not KIND=VALUE with KIND one of ref, python"):
        ab.parse(raw, WHERE)
    assert ab.parse("ref=HEAD~1", WHERE) == ("ref", "HEAD~1")


def test_an_env_file_is_key_value_lines_with_comments(tmp_path):
    good = tmp_path / "nccl.env"
    good.write_text("# NCCL of the old cluster\nNCCL_ALGO=Ring\nexport NCCL_PROTO='Simple'\n\n")
    side = prepare("env", str(good), tmp_path)
    assert side.env == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"} and side.facts["env"] == side.env
    assert dict(side.host.env) == side.env  # over the shell's own, on this side's ranks (launchers)
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_ALGO=Ring\nnot a line\n")
    with pytest.raises(ab.SideError, match=r"env=.*bad.env line 2: 'not a line' is not KEY=VALUE"):
        prepare("env", str(bad), tmp_path)


def test_a_ref_is_a_worktree_whose_harness_the_side_imports_and_which_is_removed(tmp_path):
    side = prepare("ref", "HEAD", tmp_path)
    try:
        assert side.worktree is not None and (side.worktree / "harness" / "__init__.py").is_file()
        assert side.host.cwd == str(side.worktree) and side.facts["commit"] == side.facts["commit"].strip()
        head = subprocess.run(["git", "-C", str(ab.ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert side.facts["commit"] == head and side.facts["torch"]  # probed with the side's own folder
        found = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"],
                               capture_output=True, text=True, cwd=side.host.cwd).stdout
        assert found.startswith(str(side.worktree))  # python -m harness in that folder imports its own
    finally:
        ab.remove(side)
    assert not side.worktree.exists()
    listed = subprocess.run(["git", "-C", str(ab.ROOT), "worktree", "list"], capture_output=True, text=True)
    assert str(side.worktree) not in listed.stdout


def test_sides_that_cannot_run_are_refused_naming_why(tmp_path):
    with pytest.raises(ab.SideError, match="ref=no-such-ref-0xdead: no such git ref"):
        prepare("ref", "no-such-ref-0xdead", tmp_path)
    with pytest.raises(ab.SideError, match="image= is the Kubernetes launcher's pod image"):
        prepare("image", "ghcr.io/x/y:1", tmp_path)
    with pytest.raises(ab.SideError, match="the slurm launcher's ranks do not start on this host"):
        prepare("python", sys.executable, tmp_path, launcher="slurm", on_host=False)
    with pytest.raises(ab.SideError, match="cannot run /no/such/python"):
        prepare("python", "/no/such/python", tmp_path)
    assert prepare("image", "ghcr.io/x/y:1", tmp_path, launcher="k8s", on_host=False).settings == {
        "k8s_image": "ghcr.io/x/y:1"}


def test_another_interpreter_is_probed_for_the_harness_and_its_versions(tmp_path):
    side = prepare("python", sys.executable, tmp_path)
    assert side.host == warm.Host(python=sys.executable, cwd=str(ab.ROOT))
    assert side.facts["python"] == sys.version.split()[0] and side.facts["torch"]
