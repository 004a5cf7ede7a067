"""The sha256 of raw bytes, with nothing heavy imported: the web process names an upload by
it (issue 36: it imports no torch), trainer.hashing hashes tensors beside it."""

from __future__ import annotations

import hashlib


def bytes_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def short(key: str) -> str:
    """A key trimmed for messages: enough to recognise, short enough to read."""
    return key[:12] + "…" if len(key) > 12 else key
