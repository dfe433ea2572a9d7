"""One measured case at a time on a host: what the benchmark numbers assume.

Two cases measured at once on the same cores or GPUs each see a machine shared with the
other, and both numbers would be stored as if each had it alone. So a local case is launched
only while its pytest process holds an exclusive ``flock`` on a host-wide lock file
(``$TMPDIR/pytest-llmbench.lock``, or ``LLMBENCH_HOST_LOCK``); another waits, saying who holds
it. That covers pytest-xdist workers (``pytest -n 2``), two suites started at once, and any
xdist mode. The kernel drops the lock when its holder dies. The lock is never opened through a
symlink nor chmod-ed unless this process created it: a link planted at its path by another
user is refused with a usage error.

(pytest-xdist's ``loadgroup`` would keep the cases on one worker, but with pytest 9.2 and
xdist 3.8 it does not group: xdist renames ``item._nodeid``, which pytest 9 no longer reads.)

Kubernetes cases are not covered: the scheduler gives each pod the GPUs it requests alone;
CPU-only pods of two cases may still share a node.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def default_path() -> Path:
    return Path(os.environ.get("LLMBENCH_HOST_LOCK") or Path(tempfile.gettempdir()) / "pytest-llmbench.lock")


class HostLockError(OSError):
    """The lock path is not a plain file this process may lock (a symlink, a folder, a FIFO)."""


def problem(path: Path | None = None) -> str | None:
    """Why the host lock cannot be used, or None; checked before anything runs (plugin.py)."""
    path = path or default_path()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None if os.access(path.parent, os.W_OK) else (
            f"host lock {path}: its folder is not writable (set LLMBENCH_HOST_LOCK to a file you may create)")
    except OSError as exc:
        return f"host lock {path}: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return (f"host lock {path} is a symbolic link; it is never followed (another user could point it at "
                f"a file of yours). Remove it, or set LLMBENCH_HOST_LOCK to a plain file")
    if not stat.S_ISREG(info.st_mode):
        return f"host lock {path} is not a regular file; set LLMBENCH_HOST_LOCK to a plain file"
    return None


def _open(path: Path) -> int:
    """The lock file, created 0666 if absent; never through a symlink (O_NOFOLLOW), never a
    non-regular file. Its mode is set only on a file this process created."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # past the umask: other users' suites on this host must wait too
        return fd
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise HostLockError(exc.errno, problem(path) or f"host lock {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HostLockError(f"host lock {path} is not a regular file; set LLMBENCH_HOST_LOCK to a plain file")
    return fd


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
    fd = _open(path)
    try:
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
