"""The rules for every value of a profile's ``[slurm]`` table, checked where it enters.

Standard library only. Values reach Slurm as separate ``sbatch``/``srun`` arguments, never
through a shell; the two scripts the launcher writes (launchers/slurm/launcher.py) quote every value
they hold with ``shlex.quote``. The rules are still as narrow as Slurm's own names, so that a
typo is caught at collection with the profile file and key named, not by a job that pends.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}", re.ASCII)  # partitions, accounts, qos, gres types
# node features combined with & | , * [ ] ( ) and counts, as --constraint takes them
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,*\[\]():-]{1,1024}", re.ASCII)
# pyxis/enroot: docker-style references, ``registry#image``, or a squashfs file's absolute path
CONTAINER_IMAGE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9_./:#@+-]{0,4095}", re.ASCII)
SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[^\s'\"\\`$;&|<>]+)?", re.ASCII)
PYTHON = re.compile(r"[A-Za-z0-9_./+-]{1,4096}", re.ASCII)

# Set by the launcher for every case: an extra option may not set them again.
OWNED_OPTIONS = ("--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--time", "--output",
                 "--error", "--chdir", "--job-name", "--partition", "--account", "--qos",
                 "--constraint", "--gres", "--gpus", "--gpus-per-node", "--exclusive", "--parsable",
                 "--wrap", "--export", "--requeue", "--no-requeue", "--container-image")


def _pattern(regex: re.Pattern, rule: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and regex.fullmatch(value) else rule
    return check


def _number(low: float, what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= low
        return None if ok else f"must be a number of {what} >= {low:g}"
    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def sbatch_options(value: Any) -> str | None:
    """A list of ``--name`` or ``--name=value`` items, none the launcher sets itself."""
    if not isinstance(value, list):
        return "must be a list of sbatch options, e.g. [\"--mail-type=END\"]"
    for item in value:
        if not isinstance(item, str) or not SBATCH_OPTION.fullmatch(item):
            return (f"has {item!r}: each item must be one long option, --name or --name=value, with no "
                    f"spaces, quotes or shell characters")
        if item.split("=")[0] in OWNED_OPTIONS:
            return (f"has {item!r}: the launcher sets {item.split('=')[0]} itself (from the case and "
                    f"this table's keys)")
    return None


name = _pattern(NAME, "must be a Slurm name: letters, digits, '_', '.', '+', '-', at most 128 characters")
RULES: dict[str, Callable[[Any], str | None]] = {
    "partition": name,
    "account": name,
    "qos": name,
    "constraint": _pattern(CONSTRAINT, "must be a node feature expression (letters, digits and & | , * "
                           "[ ] ( ) : - _ .)"),
    "gpu_type": name,
    "exclusive": _boolean,
    "requeue": _boolean,
    "time_margin_s": _number(0, "seconds"),
    "queue_timeout_s": _number(1, "seconds"),
    "container_image": _pattern(CONTAINER_IMAGE, "must be a pyxis image: a registry reference "
                                "(nvcr.io#nvidia/pytorch:24.05-py3) or an absolute squashfs path"),
    "python": _pattern(PYTHON, "must be the path or name of the python the nodes run (letters, "
                       "digits, '/', '.', '_', '+', '-')"),
    "sbatch_options": sbatch_options,
}


def table_problem(table: dict[str, Any]) -> tuple[str, Any, str] | None:
    """(key, value, rule) of the first bad value of a ``[slurm]`` table, or None."""
    for key, value in table.items():
        rule = RULES.get(key)
        if rule is None:
            return key, value, f"is not a key of [slurm]; known: {', '.join(RULES)}"
        problem = rule(value)
        if problem:
            return key, value, problem
    return None
