"""Files that several lanes, threads and processes of one machine read and write
(`credentials.json`, `settings.json`): one writer at a time, and never a torn file.

`locked(path)` holds a threading lock (threads of this process) and then an exclusive lock
on `<path>.lock` beside it (other processes: a second agent, the CLI, the tray): a
read-modify-write done inside it cannot lose another writer's change. `write_atomic` writes
through a temporary file of its own in the same folder (never one shared name that two
writers would truncate under each other), fsyncs it and renames it over the target, so a
reader, or a crash, sees the old file or the new one whole.

POSIX: fcntl.flock, dropped by the kernel when a holder dies (no stale locks).
Windows (WINDOWS-ONLY path, not run here): msvcrt.locking on the lock file's first byte,
retried until it is free.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

_GUARD = threading.Lock()
_THREAD_LOCKS: dict[str, threading.Lock] = {}


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _thread_lock(path: Path) -> threading.Lock:
    key = os.path.abspath(path)
    with _GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.Lock())


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive hold on `path` against this process's other threads and other processes.
    Not re-entrant: code inside must not take the same path's lock again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock(path):
        fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _lock(fd)
            try:
                yield
            finally:
                _unlock(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """`text` to `path` through this writer's own temporary file: created with `mode` from
    the start (never a moment where a private file is readable by others), fsynced, renamed
    over `path`, and the folder fsynced so that the rename survives a power cut."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if hasattr(os, "fchmod"):  # mkstemp made it 0600; widen only when asked
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    if sys.platform == "win32":  # WINDOWS-ONLY: folders cannot be opened for fsync there
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if sys.platform == "win32":  # WINDOWS-ONLY: untested here
    import msvcrt
    import time

    def _lock(fd: int) -> None:
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
                return
            except OSError:
                time.sleep(0.05)

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
