"""Task inputs this agent has had, kept by content hash: a shard is fetched once per node,
not once per task, and a model once per round.

Only inputs the sandboxed runner has checked against the task's hash are kept (the agent
parses no tensor itself). A cached file is checked again by the runner like any download:
if it went bad on disk, the task comes back `corrupt_input`, the entry is dropped and the
input fetched anew. The least recently used entries go once the cache passes its size.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

DIGEST = re.compile(r"^[0-9a-f]{64}$")  # names on disk: a content hash, nothing else
MAX_BYTES = 2 * 2**30


class InputCache:
    def __init__(self, folder: Path, max_bytes: int = MAX_BYTES) -> None:
        self.folder = folder
        self.max_bytes = max_bytes

    def _path(self, digest: object) -> Path | None:
        if not isinstance(digest, str) or not DIGEST.match(digest):
            return None
        return self.folder / f"{digest}.safetensors"

    def get(self, digest: object) -> bytes | None:
        path = self._path(digest)
        if path is None:
            return None
        try:
            data = path.read_bytes()
            os.utime(path)  # recently used
        except OSError:
            return None
        return data

    def copy_to(self, digest: object, target: Path) -> bool:
        """Copy a cached input to `target` file to file, never whole in memory (a shard of
        a large uploaded dataset runs to hundreds of MB); False when it is not cached."""
        path = self._path(digest)
        if path is None:
            return False
        try:
            shutil.copyfile(path, target)
            os.utime(path)  # recently used
        except OSError:
            with contextlib.suppress(OSError):
                target.unlink(missing_ok=True)
            return False
        return True

    def put(self, digest: object, source: Path) -> None:
        """Keep a checked input (the file is copied: the task folder goes with the task)."""
        path = self._path(digest)
        if path is None or path.exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            shutil.copyfile(source, tmp)
            tmp.replace(path)
            self._evict()

    def drop(self, *digests: object) -> None:
        for digest in digests:
            path = self._path(digest)
            if path is not None:
                path.unlink(missing_ok=True)

    def _evict(self) -> None:
        entries = []
        for p in self.folder.glob("*.safetensors"):
            with contextlib.suppress(OSError):
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):  # oldest use first
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
