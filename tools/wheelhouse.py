"""Write every wheel the project needs into one folder, for hosts without network access.

    python tools/wheelhouse.py DIR [--no-torch] [--python-version 3.12] [--platform manylinux_2_28_x86_64]
    python tools/wheelhouse.py DIR --cuda [--check]

(`make wheelhouse` runs it from the project's venv.) The set of packages and their versions
is the one this venv was installed and tested with: the dependency closure of
`pytest-llmbench[train,k8s,test]` read from the installed metadata, so the wheelhouse
carries exactly what the tests ran on and nothing else. Then:

- binary packages are downloaded as wheels for the target (`pip download --only-binary`);
- packages that ship only as an sdist (DeepSpeed) are built into a wheel here, so the target
  needs no compiler and no network; a build that is not pure Python is refused for another
  target, since it would not run there;
- the project itself is built into a wheel (the image and cluster nodes install that);
- `requirements.txt` pins all of it, each pin with the sha256 of its wheels (`pip install
  --require-hashes --no-index --find-links DIR -r DIR/requirements.txt` installs the project offline
  and refuses any wheel that is not the one downloaded or built here), and `setuptools` comes along so an
  editable install from a checkout (`make install OFFLINE=DIR`) can build offline too.

`--no-torch` leaves torch and the packages only torch needs out: a GPU host usually brings
its own CUDA torch, and pins of torch's own dependencies would fight the ones it has.

`--cuda` is for the CUDA image (docker/Dockerfile): a Linux x86_64 target whose torch is the
public release of the same version (`torch===2.13.0`: never this host's +cpu build), downloaded
with the dependencies *its* metadata names (the CUDA runtime wheels: cuda-toolkit, cuDNN, NCCL,
cuBLAS..., and triton), which this venv's CPU torch does not have. torch 2.13.0's public build is
CUDA 13.0, so the image needs an NVIDIA driver >= 580 on the node. `--check` resolves that set
without downloading it (pip's --dry-run, from the wheels' metadata: seconds), for CI.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "pytest-llmbench"
EXTRAS = ("train", "k8s", "test")
# Ship only as an sdist on PyPI: built into a wheel here. DS_BUILD_OPS=0: no compiled ops.
SDIST_ONLY = {"deepspeed"}
# The project's build backend, so `pip install -e .` works with --no-index too.
BUILD_REQUIREMENTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]


# A cross target's platform tags: pip matches only the manylinux levels it is given, and torch's
# CUDA dependencies span several (nvidia-cudnn-cu13: manylinux_2_27, nvidia-nccl-cu13: 2_18).
# Every level that Debian bookworm's glibc (2.36, the image's base) runs, down to manylinux2014.
LINUX_TAGS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + ["manylinux2014_x86_64"]


def closure(root: str, extras: tuple[str, ...], skip: set[str]) -> dict[str, str]:
    """{canonical name: installed version} of root[extras] and all it requires, in this venv.

    Requirements are followed as pip would for this interpreter (markers evaluated); a
    name in ``skip`` is neither included nor followed.
    """
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(root, extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in skip or (key, wanted) in seen:
            continue
        seen.add((key, wanted))
        dist = md.distribution(name)
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            active = req.marker is None or any(
                req.marker.evaluate({**default_environment(), "extra": extra}) for extra in ("", *wanted))
            if active:
                todo.append((req.name, tuple(sorted(req.extras))))
    return found


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def public(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': the local label is the build variant, not a pin others can meet."""
    return version.split("+", 1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--no-torch", action="store_true", help="leave torch out (the host brings its own)")
    parser.add_argument("--python-version", help="target Python, e.g. 3.12 (default: this interpreter's)")
    parser.add_argument("--platform", action="append",
                        help="target platform tag (repeatable; default: this host's)")
    parser.add_argument("--cuda", action="store_true",
                        help="the CUDA image's wheelhouse: the public torch and its CUDA dependencies")
    parser.add_argument("--check", action="store_true",
                        help="with --cuda: resolve the CUDA set only, download nothing")
    args = parser.parse_args(argv)
    cross = bool(args.python_version or args.platform or args.cuda)
    target = []
    if cross:
        target = ["--implementation", "cp", "--python-version",
                  args.python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"]
        target += [arg for tag in (args.platform or LINUX_TAGS) for arg in ("--platform", tag)]
    if args.check and not args.cuda:
        parser.error("--check resolves the CUDA set: give --cuda too")

    # --no-torch: torch is not followed, so what only torch needs stays out too.
    packages = closure(PROJECT, EXTRAS, skip={"torch"} if args.no_torch else set())
    packages.pop(canonicalize_name(PROJECT), None)
    cuda_torch = f"torch==={public(packages.pop('torch'))}" if args.cuda else None
    if args.check:
        return check_cuda(cuda_torch, target)

    final = args.dir
    out = staging(final)  # every wheel pinned below is one this run downloaded or built
    try:
        build(args, packages, cuda_torch, cross, target, out, final)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    replace(out, final)
    return 0


def staging(final: Path) -> Path:
    """A new folder beside ``final`` to build into; ``final`` must be new, empty, or a wheelhouse this
    tool wrote (it is then replaced whole: no stale or foreign wheel survives into the pins)."""
    where = f"wheelhouse {final} (argument)"
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise SystemExit(f"{where}: exists and is not a folder")
    if final.is_dir() and any(final.iterdir()) and not (final / "requirements.txt").is_file():
        raise SystemExit(f"{where}: holds files and is not a wheelhouse this tool wrote "
                         f"(no requirements.txt); name a new or empty folder")
    above = next((p for p in final.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise SystemExit(f"{where}: {above} is a file, not a folder")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:
        raise SystemExit(f"{where}: cannot write beside it in {final.parent}: {exc.strerror}") from None


def replace(built: Path, final: Path) -> None:
    """``built`` becomes ``final``; an earlier wheelhouse there is removed only once the new one is whole."""
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
        final.rename(old / "wheelhouse")
    built.rename(final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def build(args, packages: dict[str, str], cuda_torch: str | None, cross: bool, target: list[str], out: Path,
          final: Path) -> None:
    # A cross target gets the public release (on Linux, torch's is the CUDA build); this
    # host keeps its local build (torch 2.13.0+cpu here).
    pin = public if cross else str
    binary = sorted(f"{n}=={pin(v)}" for n, v in packages.items() if n not in SDIST_ONLY)
    binary += BUILD_REQUIREMENTS
    sdist = sorted(f"{n}=={public(v)}" for n, v in packages.items() if n in SDIST_ONLY)
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(out), *target, *binary)
    if cuda_torch:  # with the dependencies its own metadata names, at the tested pins where shared
        pip("download", "-q", "--only-binary=:all:", "-c", str(ROOT / "constraints.txt"), "-d", str(out),
            *target, cuda_torch)
    if sdist:
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        # --no-build-isolation: DeepSpeed's setup.py imports torch, which this venv has.
        pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), *sdist, env=env)
        if cross:
            for name in SDIST_ONLY & packages.keys():
                wheel = _wheel_of(out, name)
                if not wheel.name.endswith("-none-any.whl"):
                    raise SystemExit(f"{wheel.name} is not pure Python; build it on the target instead")
    with tempfile.TemporaryDirectory() as tmp:
        pip("wheel", "-q", "--no-deps", "-w", tmp, str(ROOT))
        (wheel,) = Path(tmp).glob("*.whl")
        project_version = wheel.name.split("-")[1]
        target_path = out / wheel.name
        target_path.unlink(missing_ok=True)
        wheel.rename(target_path)

    pins = [f"{n}=={public(v)}" for n, v in sorted(packages.items())] + ([cuda_torch] if cuda_torch else [])
    lines = [
        "# pytest-llmbench and every package it was tested with, each with the sha256 of its wheels here;",
        "# install with",
        f"#   pip install --require-hashes --no-index --find-links {final} -r {final / 'requirements.txt'}",
        *(["# torch is not here: the host's own torch is used."] if args.no_torch else []),
        hashed(f"{PROJECT}[{','.join(EXTRAS)}]=={project_version}", out),
        *(hashed(pin, out) for pin in pins),
    ]
    (out / "requirements.txt").write_text("\n".join(lines) + "\n")
    wheels = sorted(p.name for p in out.glob("*.whl"))
    size = sum(p.stat().st_size for p in out.glob("*.whl")) / 2**20
    print(f"wheelhouse {final}: {len(wheels)} wheels, {size:.0f} MiB; requirements.txt pins {len(pins) + 1}")


def hashed(pin: str, folder: Path) -> str:
    """``pin`` with ``--hash=sha256:...`` for each wheel of it in ``folder`` (pip's hash-checking mode:
    ``--require-hashes`` installs only files with these digests)."""
    requirement = Requirement(pin)
    digests = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name == canonicalize_name(requirement.name) and \
                requirement.specifier.contains(version, prereleases=True):
            check_named(wheel, name, version)
            with open(wheel, "rb") as stream:  # streamed: the CUDA torch wheel is ~1 GB
                digests.append(hashlib.file_digest(stream, "sha256").hexdigest())
    if not digests:
        raise SystemExit(f"{pin}: no wheel for it in {folder}")
    return " ".join([pin, *(f"--hash=sha256:{d}" for d in digests)])


def check_named(wheel: Path, name: str, version) -> None:
    """Refuse a wheel whose own metadata names another package or version than its file name does."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(found) != 1:
                raise SystemExit(f"{wheel}: not a wheel ({len(found)} .dist-info/METADATA files)")
            with archive.open(found[0]) as stream:
                head = stream.read(64 * 1024).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile) as exc:
        raise SystemExit(f"{wheel}: not a readable wheel: {exc}") from None
    meta = dict(line.split(": ", 1) for line in head.split("\n\n", 1)[0].splitlines() if ": " in line)
    said = (canonicalize_name(meta.get("Name", "")), public(meta.get("Version", "")))
    try:
        same = said[0] == name and Version(said[1]) == Version(public(str(version)))
    except InvalidVersion:
        same = False
    if not same:
        raise SystemExit(f"{wheel}: its metadata says {said[0]} {said[1]}, its file name {name} {version}")


def check_cuda(torch_pin: str, target: list[str]) -> int:
    """Resolve the CUDA image's torch and its dependencies for ``target`` from the wheels' metadata
    (pip --dry-run: nothing downloaded); print the set and the CUDA version; 0 when it resolves."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "-q", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--target", tmp,
            "--report", str(report), "-c", str(ROOT / "constraints.txt"), *target, torch_pin)
        found = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                 for item in json.loads(report.read_text())["install"]}
    cuda = found.get("cuda-toolkit")
    python = target[target.index("--python-version") + 1]
    print(f"{torch_pin} resolves for CPython {python} on Linux x86_64: {len(found)} wheels, CUDA {cuda}")
    for name, version in sorted(found.items()):
        print(f"  {name}=={version}")
    if found.get("torch") != torch_pin.split("===")[1] or cuda is None:
        print("not the public CUDA build of torch: the image could not use a GPU", file=sys.stderr)
        return 1
    return 0


def _wheel_of(folder: Path, name: str) -> Path:
    pattern = re.compile(rf"^{re.escape(name.replace('-', '_'))}-.*\.whl$", re.I)
    (wheel,) = [p for p in folder.iterdir() if pattern.match(p.name)]
    return wheel


if __name__ == "__main__":
    sys.exit(main())
