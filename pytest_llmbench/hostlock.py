"""One measured case at a time on a host: what the benchmark numbers assume.

Two cases measured at once on the same cores or GPUs each see a machine shared with the
other, and both numbers would be stored as if each had it alone. So a local case is launched
only while its pytest process holds an exclusive ``flock`` on a host-wide lock file
(``$TMPDIR/pytest-llmbench.lock``, or ``LLMBENCH_HOST_LOCK``); another waits, saying who holds
it. That covers pytest-xdist workers (``pytest -n 2``), two suites started at once, and any
xdist mode. The kernel drops the lock when its holder dies.

(pytest-xdist's ``loadgroup`` would keep the cases on one worker, but with pytest 9.2 and
xdist 3.8 it does not group: xdist renames ``item._nodeid``, which pytest 9 no longer reads.)

Kubernetes cases are not covered: the scheduler gives each pod the GPUs it requests alone;
CPU-only pods of two cases may still share a node.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def default_path() -> Path:
    return Path(os.environ.get("LLMBENCH_HOST_LOCK") or Path(tempfile.gettempdir()) / "pytest-llmbench.lock")


def xdist_note(option) -> str | None:
    """What a user of pytest-xdist should know, or None when xdist does not distribute."""
    if getattr(option, "dist", "no") == "no":
        return None
    return ("pytest-xdist: benchmark cases take the host lock one at a time (workers wait their turn); "
            "other tests running beside a case share its machine")


@contextlib.contextmanager
def exclusive(holder: str, say: Callable[[str], None], path: Path | None = None,
              every_s: float = 30.0) -> Iterator[None]:
    """Hold the host lock while the block runs; wait (saying so every ``every_s``) while
    another process holds it."""
    path = path or default_path()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # other users' suites on this host must be able to wait too
        waited_since, last_said = time.monotonic(), 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - last_said >= every_s:
                    other = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                    say(f"waiting for the host: {other} is being measured (lock {path}, "
                        f"{time.monotonic() - waited_since:.0f} s so far)")
                    last_said = time.monotonic()
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()})".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
