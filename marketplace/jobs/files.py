"""Artifacts in Django storage (filesystem or S3): models, shards, updates, checkpoints.

trainer/ works on local paths; `local_copy` bridges the two for storages without a path.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, default_storage, storages


def job_dir(job_id: object) -> str:
    return f"jobs/{job_id}"


def put(name: str, data: bytes, *, content_addressed: bool = False) -> str:
    """Write `data` under exactly `name`, replacing what was there (names are content keys
    or per-job singletons, so a retried task writes the same bytes again). A content-addressed
    name that exists already holds these bytes and is left alone, unless its size says a
    write was cut short there."""
    storage = storages["default"]
    if isinstance(storage, FileSystemStorage):
        return _put_local(storage, name, data, content_addressed)
    if default_storage.exists(name):
        if content_addressed and default_storage.size(name) == len(data):
            return name
        default_storage.delete(name)
    # object stores (S3) make an object visible only once it is whole
    saved = default_storage.save(name, ContentFile(data))
    if saved != name:  # a storage that renames on conflict would break content addressing
        raise RuntimeError(f"storage saved {name!r} as {saved!r}")
    return name


def _put_local(storage: FileSystemStorage, name: str, data: bytes, content_addressed: bool) -> str:
    """Atomically, through a temporary file and a rename: a process killed mid-write (a web
    server restarted during an upload) leaves the old file or none, never a cut-off one that
    a retry would then take for the whole."""
    path = Path(storage.path(name))
    if content_addressed and path.is_file() and path.stat().st_size == len(data):
        return name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if storage.file_permissions_mode is not None:
            os.chmod(tmp, storage.file_permissions_mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return name


def get(name: str) -> bytes:
    with default_storage.open(name, "rb") as fh:
        return fh.read()


def size(name: str) -> int:
    return default_storage.size(name)


def delete_tree(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            default_storage.delete(name)


@contextlib.contextmanager
def local_copy(name: str, suffix: str = "") -> Iterator[Path]:
    """A local path for a stored file: the file itself on the filesystem storage, else a
    temporary copy (S3 and other remote storages)."""
    storage = storages["default"]
    if isinstance(storage, FileSystemStorage):
        yield Path(storage.path(name))
        return
    with tempfile.TemporaryDirectory(prefix="gpuflex-") as tmp:
        path = Path(tmp) / (Path(name).name or f"file{suffix}")
        path.write_bytes(get(name))
        yield path
