"""Reading a run spec: a file, or the JSON of an environment variable (``--spec env:NAME``), both
through harness/untrusted.py's reader (a regular file or a value, bounded, strict UTF-8, finite
numbers, nesting the parser can take). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

from harness.spec import RunSpec, SpecError
from harness.untrusted import UntrustedError, parse_json, read_json

SPEC_LIMIT = 1 << 20  # a spec is a few KiB; a larger file is not one


def load_spec(path: str | Path) -> RunSpec:
    """Read a spec file (harness/untrusted.py: a regular file, bounded, strict UTF-8, finite numbers);
    every problem is a SpecError naming the file."""
    try:
        return spec_from_data(read_json(path, SPEC_LIMIT, "a run spec"))
    except (UntrustedError, SpecError) as exc:
        raise SpecError(f"{path}: {exc}") from None


def spec_from_data(data: object) -> RunSpec:
    """A RunSpec from parsed JSON; a wrong shape is a SpecError."""
    if not isinstance(data, dict):
        raise SpecError(f"a run spec is a JSON object, not {type(data).__name__}")
    try:
        return RunSpec.from_dict(data)
    except TypeError as exc:  # e.g. a wrong-typed nested value
        raise SpecError(str(exc)) from None


def spec_of(where: str) -> RunSpec:
    """``--spec``'s value: a file, or ``env:NAME``, the JSON in that environment variable (read as
    bytes: a value that is not UTF-8 is refused as such)."""
    if not where.startswith("env:"):
        return load_spec(where)
    name = where[4:]
    raw = os.environb.get(name.encode(errors="surrogateescape"))
    if raw is None:
        raise SpecError(f"--spec {where}: the environment variable {name} is not set")
    try:
        return spec_from_data(parse_json(raw, SPEC_LIMIT, "a run spec"))
    except (UntrustedError, SpecError) as exc:
        raise SpecError(f"--spec {where}: {exc}") from None
