"""Files read as untrusted input: a stored result, a Hugging Face config.json, an A/B side's env file,
a run spec (a file, or the environment variable of ``--spec env:NAME``). Standard library only: the
harness reads its spec with it in the pod, the plugin its stored results.

Each is data someone else wrote or downloaded, so each read is bounded and never waits: the file is
opened without blocking (a FIFO with no writer would wait forever) and read only when it is a regular
file (``/dev/zero`` never ends), at most ``limit`` bytes; JSON is strict UTF-8 with finite numbers,
and nesting too deep for the parser is an error, not a RecursionError. UntrustedError's message says
what is wrong; each caller names the file and where it came from.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class UntrustedError(ValueError):
    """A file that cannot be read as the data it should hold; the message says why."""


def read_regular(path: str | Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (``what`` it should be, for the message)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UntrustedError(f"cannot read it: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UntrustedError(f"not a regular file (a folder, FIFO, socket or device); {what} is a file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise UntrustedError(f"cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        size = f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit // 2**10} KiB"
        raise UntrustedError(f"larger than {size}; not {what}")
    return raw


def read_json(path: str | Path, limit: int, what: str) -> Any:
    """The JSON value of the regular file ``path``: read_regular, strict UTF-8, finite numbers only."""
    return parse_json(read_regular(path, limit, what), limit, what)


def parse_json(raw: bytes, limit: int, what: str) -> Any:
    """The JSON value of ``raw`` (at most ``limit`` bytes): strict UTF-8, finite numbers only, nesting
    the parser can take."""
    if len(raw) > limit:
        raise UntrustedError(f"larger than {limit} bytes; not {what}")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise UntrustedError(f"not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise UntrustedError(f"JSON nested too deep; not {what}") from None
    except ValueError as exc:
        raise UntrustedError(f"not valid JSON: {exc}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")
