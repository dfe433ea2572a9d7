"""The A/B sides (pytest_llmbench/ab.py): each kind parsed, made ready or refused with the option's
source and the reason, before any case runs; a ref's worktree imports that ref's harness and is
removed at the end; an env file's variables beat the shell's on that side's ranks only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_llmbench import ab
from pytest_llmbench.launchers.local import warm

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


@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_program_that_exits_0_without_answering_the_probe_is_not_a_side(tmp_path, program):
    """/bin/true and /bin/echo exit 0: an IndexError and a JSONDecodeError before, a usage error now."""
    with pytest.raises(ab.SideError, match=f"python={program}: {program} is not a Python that runs the "
                                           f"harness: .* exited 0 and printed"):
        prepare("python", program, tmp_path)


def test_a_ref_whose_tree_has_no_harness_is_refused_not_compared_with_this_checkout(tmp_path):
    """Its ranks' ``import harness`` would find this checkout's through the editable install: A/B would
    compare the candidate with itself under the ref's name."""
    git = ["git", "-C", str(ab.ROOT)]
    index = {"GIT_INDEX_FILE": str(tmp_path / "index"), "PATH": "/usr/bin:/bin",
             "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run([*git, "read-tree", "HEAD"], env=index, check=True)
    subprocess.run([*git, "rm", "-r", "-q", "--cached", "harness"], env=index, check=True)
    tree = subprocess.run([*git, "write-tree"], env=index, check=True, capture_output=True, text=True).stdout
    commit = subprocess.run([*git, "commit-tree", tree.strip(), "-p", "HEAD", "-m", "no harness"], env=index,
                            check=True, capture_output=True, text=True).stdout.strip()
    said = f"ref={commit}: the ref's tree has no harness/, so its ranks would import the harness at "
    session = f"20261127T000000Z-{commit[:4]}"
    with pytest.raises(ab.SideError, match=said + str(ab.ROOT / "harness")):
        ab.prepare("ref", commit, where=WHERE, launcher="local", on_this_host=True, output=tmp_path,
                   session_id=session)
    assert not list(Path(tempfile.gettempdir()).glob(f"llmbench-ab-{session}-*/*"))  # its worktree removed


@pytest.mark.parametrize(("content", "says"), [
    (b"NCCL_ALGO=Ring\n\xff\xfe=1\n", "line 2: not UTF-8 text (byte 0)"),
    (b"\x7fELF\x02\x01\x01\x00\x90\xff", "line 1: not UTF-8 text"),
    (b"NCCL_ALGO=Ri\x00ng\n", "line 1: NCCL_ALGO: the value holds a NUL character"),
    (b"# ok\nMASTER_PORT=29500\n", "line 2: MASTER_PORT: MASTER_PORT is set by the launchers for every rank"),
    (b"RANK=3\n", "line 1: RANK: RANK is set by the launchers"),
    (b"PET_NNODES=2\n", "line 1: PET_NNODES: PET_NNODES is set by the launchers"),
    (b"X=" + b"a" * 70_000, "larger than 64 KiB"),
])
def test_an_env_file_holds_to_the_profile_env_rules_and_is_read_as_data(tmp_path, content, says):
    path = tmp_path / "side.env"
    path.write_bytes(content)
    with pytest.raises(ab.SideError, match=f"{WHERE}: env={path}.*{re.escape(says)}"):
        prepare("env", str(path), tmp_path)


@pytest.mark.parametrize("make", [os.mkfifo, lambda p: p.symlink_to("/dev/zero"), lambda p: p.mkdir()])
def test_an_env_file_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, make):
    path = tmp_path / "side.env"
    make(path)
    with pytest.raises(ab.SideError, match="not a regular file"):
        prepare("env", str(path), tmp_path)


def test_an_env_file_may_not_move_the_harness_but_may_preload_a_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # pytest run from elsewhere: the ranks find the harness on sys.path
    fake = tmp_path / "elsewhere" / "harness"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    moved = tmp_path / "moved.env"
    moved.write_text(f"PYTHONPATH={fake.parent}\n")
    with pytest.raises(ab.SideError, match=f"its ranks would import the harness at {fake}, not the one in"):
        prepare("env", str(moved), tmp_path)
    preload = tmp_path / "preload.env"
    preload.write_text("LD_PRELOAD=\nMALLOC_ARENA_MAX=2\n")  # an allocator knob: taken as given
    assert prepare("env", str(preload), tmp_path).env == {"LD_PRELOAD": "", "MALLOC_ARENA_MAX": "2"}
