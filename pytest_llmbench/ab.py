"""A/B in one session (``--llmbench-ab SIDE``): the two sides a gated change is measured on.

Every selected case runs on both sides in the same session on the same machine, in balanced rounds
(A then B, then B then A, ...: ABBA), each side on its own warm ranks; the verdict reads each round's
paired ratio, so a drift of the machine between rounds cancels (pytest_llmbench/gates.py).

    candidate   what the session runs anyway: this checkout's harness, this interpreter, the
                profile's environment
    baseline    SIDE, one of
      ref=GITREF    the harness of that git ref, from a worktree in a temporary folder that the ranks
                    start in (``python -m harness`` imports the harness of its folder first): a
                    change to the training code
      python=PATH   another interpreter, started in this checkout: a venv with the torch,
                    DeepSpeed or NCCL being upgraded from
      env=FILE      extra environment (``KEY=VALUE`` lines; ``#`` comments): NCCL settings, an
                    allocator knob. The profile ``[env]`` rules hold (no variable the launchers set:
                    MASTER_*, RANK, PET_*, ...; no NUL); LD_PRELOAD (a malloc, a profiler) is taken
                    as given; PYTHONPATH may not move the harness: the probe below refuses a side
                    whose ``import harness`` is not this checkout's
      image=REF     the Kubernetes launcher's pod image (--llmbench-k8s-image of the baseline)

Both sides run the same case specs; a side that cannot run is a usage error naming it, before any
case: no such ref, an interpreter without the harness's dependencies, a bad env file, image= off
Kubernetes, ref= or python= with a launcher whose ranks do not start on this host. A side is what it
says: its interpreter, started as its ranks will be (folder and environment), must answer the probe
and import the harness from the side's own folder (a ref whose tree has no ``harness/`` would import
this checkout's through the editable install and compare the candidate with itself). Each side's
facts (commit, interpreter, torch/DeepSpeed versions, environment) are stored with its results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness.untrusted import UntrustedError, read_regular
from pytest_llmbench.launchers.local.warm import Host

KINDS = ("ref", "python", "env", "image")
ROOT = Path(harness.__file__).resolve().parent.parent  # the checkout holding the candidate's harness
# what an interpreter must import to run a case, and what it reports (checked before any case runs)
PROBE = ("import json, sys, torch, harness\n"
         "try:\n    import deepspeed; ds = deepspeed.__version__\nexcept Exception:\n    ds = None\n"
         "print(json.dumps({'python': sys.version.split()[0], 'executable': sys.executable,"
         " 'torch': torch.__version__, 'deepspeed': ds, 'harness': harness.__file__}))")
PROBE_KEYS = ("python", "executable", "torch", "deepspeed", "harness")
MAX_ENV_FILE_BYTES = 64 * 2**10  # an env file of a few settings; anything larger is not one


class SideError(ValueError):
    """A side that cannot run; the message names it and why."""


@dataclass(frozen=True)
class Side:
    name: str  # "candidate" or "baseline"
    spelled: str  # as given: "ref=HEAD~1"; "" for the candidate
    host: Host = field(default_factory=Host)
    env: dict[str, str] = field(default_factory=dict)  # added to the profile's [env]
    settings: dict[str, str] = field(default_factory=dict)  # launcher options changed (image=)
    facts: dict = field(default_factory=dict)  # what it ran, stored with its results
    worktree: Path | None = None  # removed at the end of the session


def side_option(raw: str, where: str) -> tuple[str, str]:
    """``--llmbench-ab``'s value as an option parser takes it (settings.py): ``parse``, its error a usage
    error naming ``where``."""
    import pytest

    try:
        return parse(raw, where)
    except SideError as exc:
        raise pytest.UsageError(str(exc)) from None


def parse(raw: str, where: str) -> tuple[str, str]:
    """``KIND=VALUE`` with a known kind (the option's parser; ``where`` names the flag, env or ini)."""
    kind, sep, value = raw.partition("=")
    if not sep or kind not in KINDS or not value.strip():
        raise SideError(f"{where}: {raw!r} is not KIND=VALUE with KIND one of {', '.join(KINDS)} "
                        f"(e.g. ref=HEAD~1, python=/opt/old-venv/bin/python, env=nccl.env, image=REF)")
    return kind, value.strip()


def candidate(launcher_on_host: bool) -> Side:
    """This session's own side: its facts read the same way as the baseline's."""
    facts = {"commit": _git("rev-parse", "HEAD")}
    if launcher_on_host:
        facts |= interpreter_facts(Host())
    return Side("candidate", "", facts=facts)


def prepare(kind: str, value: str, *, where: str, launcher: str, on_this_host: bool, output: Path,
            session_id: str, runs: tuple[str, ...] | None = None) -> Side:
    """The baseline side ``kind=value``, ready to run (a worktree made, an interpreter probed); a
    SideError naming ``where`` when it cannot run. ``runs``: the side kinds the launcher declares it
    can run (LauncherKind.ab_sides; default: the registered launcher's)."""
    from pytest_llmbench import launchers

    runs = launchers.get(launcher).ab_sides if runs is None else runs
    spelled = f"{kind}={value}"
    if kind in ("ref", "python") and kind not in runs:
        raise SideError(f"{where}: {spelled}: the {launcher} launcher's ranks do not start on this host "
                        f"with another folder or interpreter (ref= and python= need a launcher that "
                        f"declares them, e.g. --llmbench-launcher=local)")
    if kind == "image" and kind not in runs:
        raise SideError(f"{where}: {spelled}: image= is the Kubernetes launcher's pod image "
                        f"(--llmbench-launcher=k8s); this session runs {launcher}")
    if kind not in runs:
        raise SideError(f"{where}: {spelled}: the {launcher} launcher does not run {kind}= sides (it "
                        f"declares {', '.join(runs)})")
    if kind == "env":
        env = read_env_file(Path(value), where)  # over the shell's own on this host (Host.env)
        host = Host(env=tuple(sorted(env.items())))
        if on_this_host:  # its ranks start here: the harness they import is still this checkout's
            _probe(host, ROOT, where, spelled)
        return Side("baseline", spelled, env=env, host=host, facts={"env": env})
    if kind == "image":
        return Side("baseline", spelled, settings={"k8s_image": value}, facts={"image": value})
    if kind == "python":
        host = Host(python=value, cwd=str(ROOT))
        facts = _probe(host, ROOT, where, spelled)
        return Side("baseline", spelled, host=host, facts=facts | {"commit": _git("rev-parse", "HEAD")})
    commit = _git("rev-parse", "--verify", "--quiet", f"{value}^{{commit}}")
    if not commit:
        raise SideError(f"{where}: {spelled}: no such git ref in {ROOT}")
    # a temporary folder, never under the output or the checkout: pytest would collect its tests
    tree = Path(tempfile.mkdtemp(prefix=f"llmbench-ab-{session_id}-")) / commit[:12]
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree),
                           commit], capture_output=True, text=True)
    if made.returncode != 0:
        raise SideError(f"{where}: {spelled}: git worktree add failed: {made.stderr.strip()}")
    host = Host(cwd=str(tree))
    try:
        facts = _probe(host, tree, where, spelled)
    except SideError:
        remove(Side("baseline", spelled, worktree=tree))
        raise
    return Side("baseline", spelled, host=host, facts=facts | {"commit": commit, "ref": value}, worktree=tree)


def sides(settings, kind, output: Path, session_id: str) -> dict[str, Side]:
    """Both sides of ``--llmbench-ab`` ready to run; SideError naming the option's source when the
    baseline cannot run."""
    side_kind, value = settings.ab
    baseline = prepare(side_kind, value, where=settings.sources["ab"], launcher=kind.name,
                       on_this_host=kind.on_this_host, output=output, session_id=session_id,
                       runs=kind.ab_sides)
    return {"candidate": candidate(kind.on_this_host), "baseline": baseline}


def facts_json(both: dict[str, Side]) -> str:
    """What each side ran, as stored beside the session's results (``_ab.json``)."""
    return json.dumps({name: {"side": s.spelled or "this session", **s.facts} for name, s in both.items()},
                      indent=1, sort_keys=True)


def _probe(host: Host, folder: Path, where: str, spelled: str) -> dict:
    """interpreter_facts of the side, whose harness must be the one in ``folder``; SideError naming
    ``where`` and the side otherwise."""
    try:
        facts = interpreter_facts(host)
    except SideError as exc:
        raise SideError(f"{where}: {spelled}: {exc}") from None
    imported = Path(facts["harness"]).resolve()
    if not imported.is_relative_to(folder.resolve()):
        what = ("the ref's tree has no harness/, so its ranks would import"
                if host.cwd and not (Path(host.cwd) / "harness").is_dir() else "its ranks would import")
        raise SideError(f"{where}: {spelled}: {what} the harness at {imported.parent}, not the one in "
                        f"{folder}: the side would not run what it names")
    return facts


def interpreter_facts(host: Host) -> dict:
    """The interpreter's Python, torch and DeepSpeed versions and the harness it imports, started as
    the side's ranks are (its folder, its environment over this one); SideError when it cannot, or
    when what answers is not the probe (``python=/bin/true`` exits 0 and prints nothing)."""
    try:
        done = subprocess.run([host.python, "-c", PROBE], capture_output=True, timeout=300,
                              cwd=host.cwd, env={**os.environ, **dict(host.env)})
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise SideError(f"cannot run {host.python}: {exc}") from None
    stdout, stderr = (done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    if done.returncode != 0:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise SideError(f"{host.python} cannot import the harness and its dependencies (torch): {last}")
    try:
        facts = json.loads((stdout.strip().splitlines() or [""])[-1])
    except ValueError:
        facts = None
    if not isinstance(facts, dict) or not all(key in facts for key in PROBE_KEYS):
        said = stdout.strip()[-200:] or "nothing"
        raise SideError(f"{host.python} is not a Python that runs the harness: asked to import it, torch "
                        f"and DeepSpeed and print their versions, it exited 0 and printed {said!r}")
    return facts


def read_env_file(path: Path, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments skipped), under a profile ``[env]``'s rules
    (profiles/tables.parse_env); SideError naming file and line. Read as data: a regular file of at
    most MAX_ENV_FILE_BYTES (harness/untrusted.py), UTF-8, no NUL."""
    from pytest_llmbench.profiles.tables import parse_env

    try:
        raw = read_regular(path, MAX_ENV_FILE_BYTES, "an env file")
    except UntrustedError as exc:
        raise SideError(f"{where}: env={path}: {exc}") from None
    env, lines = {}, {}
    for number, data in enumerate(raw.split(b"\n"), 1):
        try:
            line = data.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise SideError(f"{where}: env={path} line {number}: not UTF-8 text (byte {exc.start})") from None
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip().removeprefix("export ").strip()
        if not sep or not key.replace("_", "").isalnum() or not key.isascii() or key[0].isdigit():
            raise SideError(f"{where}: env={path} line {number}: {line!r} is not KEY=VALUE")
        env[key], lines[key] = value.strip().strip("'\""), number

    def bad(key: str, why: str) -> SideError:
        name = key.removeprefix("env.").strip('"')
        return SideError(f"{where}: env={path} line {lines.get(name, '?')}: {name}: {why}")

    return parse_env(env, bad)


def remove(side: Side) -> None:
    """Remove the side's worktree (the end of the session)."""
    if side.worktree is None:
        return
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(side.worktree)],
                   capture_output=True, text=True)
    shutil.rmtree(side.worktree.parent, ignore_errors=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, text=True)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


