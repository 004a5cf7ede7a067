"""One agent per data folder: an exclusive lock on `agent.lock` there, holding the owner's pid.

POSIX: fcntl.flock, dropped by the kernel when the process dies (no stale locks).
Windows (WINDOWS-ONLY path, not run here): msvcrt.locking on the same file, likewise
released when the process ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO


class AlreadyRunning(RuntimeError):
    def __init__(self, pid: int | None, path: Path) -> None:
        self.pid = pid
        self.path = path
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"a GPUFlex agent is already running for {path.parent} ({who})")


def lock_file(data_dir: Path) -> Path:
    return data_dir / "agent.lock"


def holder_pid(data_dir: Path) -> int | None:
    """The pid written by the lock's holder (it may have exited since: check the lock)."""
    try:
        return int(lock_file(data_dir).read_text(encoding="ascii").strip() or 0) or None
    except (OSError, ValueError):
        return None


class InstanceLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = lock_file(data_dir)
        self._file: IO[str] | None = None

    def acquire(self) -> InstanceLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # "a+": never truncate before holding the lock, or the holder's pid would be lost
        f = open(self.path, "a+", encoding="ascii")  # noqa: SIM115 - held while running
        try:
            _lock(f)
        except OSError:
            f.close()
            raise AlreadyRunning(holder_pid(self.path.parent), self.path) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.seek(0)
                self._file.truncate()
                _unlock(self._file)
            self._file.close()
            self._file = None

    def __enter__(self) -> InstanceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


if sys.platform == "win32":  # WINDOWS-ONLY: untested here
    import msvcrt

    def _lock(f: IO[str]) -> None:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]

    def _unlock(f: IO[str]) -> None:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]

else:
    import fcntl

    def _lock(f: IO[str]) -> None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(f: IO[str]) -> None:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
