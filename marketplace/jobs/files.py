"""Artifacts in Django storage (filesystem or S3): models, shards, updates, checkpoints.

trainer/ works on local paths; `local_copy` bridges the two for storages without a path.
"""

from __future__ import annotations

import contextlib
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
    name that exists already holds these bytes and is left alone."""
    if default_storage.exists(name):
        if content_addressed:
            return name
        default_storage.delete(name)
    saved = default_storage.save(name, ContentFile(data))
    if saved != name:  # a storage that renames on conflict would break content addressing
        raise RuntimeError(f"storage saved {name!r} as {saved!r}")
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
