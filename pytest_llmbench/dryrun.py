"""``--llmbench-dry-run``: every selected case written, nothing run.

For each case: its run spec (``spec.json``, what the ranks would read) and what its launcher would
start or submit, from the launcher's ``preview`` (local: the torchrun command; slurm: the job and
task scripts and the sbatch command; k8s: the case's manifests), under
``OUTPUT/dry-run/<session>/<case>/``, the commands naming that folder (its spec.json, its job.sh):
``sh torchrun.sh`` there runs the case as the local launcher would, fresh. A launcher without
``preview`` (a plugin's) gets the spec and a line saying so. Reaching a cluster is not checked (no
kubeconfig or Slurm commands needed), nor is the host lock taken; the profiles, options and
placements are checked as for a real run.
"""

from __future__ import annotations

from pathlib import Path

from harness.transport import write_atomic
from pytest_llmbench.session import git_commit


def check_folder(settings, where: str) -> None:
    """OUTPUT/dry-run is a folder or absent, else a usage error (``where``: the output option's source)."""
    import pytest

    dry = Path(settings.output) / "dry-run"
    if dry.is_symlink() or (dry.exists() and not dry.is_dir()):
        raise pytest.UsageError(f"{settings.sources['dry_run']}: {dry} exists and is not a folder (the dry "
                                f"run writes each case under it); move it or choose another {where}")


REFUSED = "CANNOT-RUN.txt"  # a preview file saying the launcher would refuse the case, and why


def write_case(runner, case) -> tuple[Path, str | None, list[str]]:
    """The case's spec and its launcher's preview, written: the folder, the launcher's refusal (or
    None) and its warnings (the ``WARNING*.txt`` files of the preview)."""
    session, settings = runner.session, runner.settings
    folder = session.output / "dry-run" / session.store.session_id / case.id  # checked: plugin._check_output
    run_id = f"{case.id}-dry-run"
    env = {**case.profile.env, "LLMBENCH_GIT_COMMIT": git_commit() or ""}
    timeout = settings.timeout or case.profile.timeout_s
    kind = session.launcher
    launcher = kind.make(settings, case.profile)
    write_atomic(folder / "spec.json", case.spec.dumps())
    preview = getattr(launcher, "preview", None)
    if preview is None:
        write_atomic(folder / "PREVIEW.txt", f"the {kind.name} launcher gives no preview of what it runs\n")
        return folder, None, []
    run_dir = folder.resolve()  # the commands name this folder: its spec.json, its job.sh
    files = preview(case.spec, run_id=run_id, timeout_s=timeout, env=env, run_dir=run_dir)
    for name, text in files.items():
        write_atomic(folder / name, text)
    warnings = [text.strip() for name, text in sorted(files.items()) if name.startswith("WARNING")]
    return folder, (files[REFUSED].strip() if REFUSED in files else None), warnings
