"""Artifacts in Django storage (filesystem or S3): models, shards, updates, checkpoints.

trainer/ works on local paths; `local_copy` bridges the two for storages without a path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from django.core.files.base import ContentFile, File
from django.core.files.storage import FileSystemStorage, default_storage, storages

COPY_BUFFER = 2**20  # bytes per read when a file is streamed


def job_dir(job_id: object) -> str:
    return f"jobs/{job_id}"


def provenance_name(job_id: object) -> str:
    """Where a job's provenance chain is kept (rounds.aggregation writes it)."""
    return f"{job_dir(job_id)}/provenance.json"


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
    _replace_whole(storage, path, lambda fh: fh.write(data))
    return name


def _replace_whole(
    storage: FileSystemStorage, path: Path, write: Callable[[BinaryIO], object]
) -> None:
    """`write` into a temporary file beside `path`, flushed to disk, then renamed over it:
    `path` holds the old file or the whole new one, never a cut-off one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if storage.file_permissions_mode is not None:
            os.chmod(tmp, storage.file_permissions_mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def put_file(name: str, source: Path, *, move: bool = False) -> str:
    """Store the local file `source` under exactly `name`, streamed, never read whole into
    memory (datasets run to gigabytes). The stored file appears whole or not at all: on the
    filesystem storage through a rename (with `move`, the source itself is renamed there
    when both are on one filesystem), on object stores by their own upload."""
    storage = storages["default"]
    if isinstance(storage, FileSystemStorage):
        return _put_local_file(storage, name, source, move)
    if default_storage.exists(name):
        default_storage.delete(name)
    with source.open("rb") as fh:
        saved = default_storage.save(name, File(fh, name=Path(name).name))
    if saved != name:
        raise RuntimeError(f"storage saved {name!r} as {saved!r}")
    if move:
        source.unlink(missing_ok=True)
    return name


def _put_local_file(storage: FileSystemStorage, name: str, source: Path, move: bool) -> str:
    path = Path(storage.path(name))
    path.parent.mkdir(parents=True, exist_ok=True)
    if move and os.stat(source).st_dev == os.stat(path.parent).st_dev:
        if storage.file_permissions_mode is not None:
            os.chmod(source, storage.file_permissions_mode)
        os.replace(source, path)  # atomic: the whole file or the old one
        return name
    with source.open("rb") as src:
        _replace_whole(storage, path, lambda out: shutil.copyfileobj(src, out, COPY_BUFFER))
    if move:
        source.unlink(missing_ok=True)
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
        with default_storage.open(name, "rb") as src, path.open("wb") as out:
            shutil.copyfileobj(src, out, COPY_BUFFER)  # streamed: datasets are large
        yield path
