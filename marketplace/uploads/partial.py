"""An open upload's bytes on the server's disk, one partial file per session.

Chunks are streamed from the request to the file in small pieces, so memory stays bounded
whatever the file's size. Bytes a chunk wrote count only once the whole chunk is on disk
(fsynced): a dropped connection leaves the file cut back to where the session stood.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

PIECE = 2**20  # bytes read from the request (or the file, to hash it) at a time


def upload_dir() -> Path:
    return Path(settings.GPUFLEX["UPLOAD_DIR"])


def partial_path(upload_id: object) -> Path:
    return upload_dir() / f"{upload_id}.part"


def current_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def write_at(path: Path, offset: int, stream: BinaryIO, length: int) -> int:
    """Write `length` bytes read from `stream` at `offset`, dropping whatever lay past it
    (the rest of a chunk cut off earlier). Returns the bytes written: fewer than `length`
    when the stream ended early, and then the file is cut back to `offset`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+b") as fh:
        fh.truncate(offset)
        fh.seek(offset)
        left = length
        while left:
            try:
                piece = stream.read(min(left, PIECE))
            except OSError:  # the client went away mid-chunk (UnreadablePostError and kin)
                piece = b""
            if not piece:
                break
            fh.write(piece)
            left -= len(piece)
        if left:
            fh.truncate(offset)
            return length - left
        fh.flush()
        os.fsync(fh.fileno())  # `received` moves only over bytes that are on disk
    return length


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while piece := fh.read(PIECE):
            digest.update(piece)
    return digest.hexdigest()


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
