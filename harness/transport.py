"""How a result leaves a rank: written atomically to a file, and printed between checksummed
markers on stdout (what the Kubernetes launcher reads from a pod's log). Standard library only."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from harness.result import BenchResult, ResultError

MARKER_BEGIN = "LLMBENCH_RESULT_BEGIN"
MARKER_END = "LLMBENCH_RESULT_END"


def write_atomic(path: str | Path, text: str | bytes, *, exclusive: bool = False) -> bool:
    """Write ``text`` (or bytes) to ``path`` via a temp file and rename: never a half-written
    file, and never through a symlink at ``path`` (the rename replaces the link itself).

    With ``exclusive`` the file is only created if absent (first writer wins) and the
    return value says whether this call wrote it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def marked(result: BenchResult) -> str:
    """Three stdout lines that carry the result through a log: begin+sha256, JSON, end."""
    payload = result.dumps()
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return f"{MARKER_BEGIN} {digest}\n{payload}\n{MARKER_END}\n"


def extract_marked(text: str) -> BenchResult | None:
    """The last complete marked result in a log; None if there is none.

    Raises ResultError when a result is present but truncated or its checksum fails.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(MARKER_BEGIN)]
    if not starts:
        return None
    i = starts[-1]
    parts = lines[i].split()
    if len(parts) != 2 or i + 2 >= len(lines) or lines[i + 2].strip() != MARKER_END:
        raise ResultError("result in log is truncated (no end marker after the payload)")
    payload = lines[i + 1]
    if hashlib.sha256(payload.encode()).hexdigest() != parts[1]:
        raise ResultError("result in log fails its sha256 check (tampered or corrupted)")
    return BenchResult.loads(payload)
