"""A content-addressed store of tensor states and raw payloads on the local filesystem.

Models, strategy states and updates are stored under their `state_hash`, raw payloads
(encoded updates, shards) under their sha256. Because the key *is* the content hash, a
reader can always check what it got: `get_state`/`get_bytes` re-hash after loading, so a
swapped or bit-rotted file is reported instead of silently used. Provenance replay relies
on exactly this.

Layout: ``root/ab/abcdef….safetensors`` for states, ``root/ab/abcdef….bin`` for payloads.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainer.digest import short
from trainer.hashing import bytes_hash, state_hash

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_STATE_SUFFIX = ".safetensors"
_BYTES_SUFFIX = ".bin"
# safetensors metadata is str -> str; user metadata travels as one JSON document
_META_KEY = "gpuflex"


class ArtifactError(KeyError, ValueError):
    """A missing, corrupt or tampered artifact.

    A KeyError so lookups of unknown keys can be caught like any mapping miss, and a
    ValueError for bad keys and bad content.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes
        return str(self.args[0]) if self.args else ""


def prepare_for_save(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, unshared copies: safetensors refuses tensors that share memory
    (tied weights, views of one buffer) and non-contiguous ones."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state entry '{name}' is {type(tensor).__name__}, not a tensor")
        out[name] = tensor.detach().to("cpu").contiguous().clone()
    return out


def atomic_write(path: Path, write: Any) -> None:
    """Call `write(tmp_path)` then move the result into place, so readers never see a half
    file and a crash leaves at most a stray temp file (named ``.tmp-*``), never a bad one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ArtifactStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r})"

    # -- paths ---------------------------------------------------------------------------

    def _path(self, key: str, suffix: str) -> Path:
        # validating the key also keeps a hostile key ("../..") from escaping root
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ArtifactError(f"invalid artifact key {key!r}: expected 64 lowercase hex digits")
        return self.root / key[:2] / (key + suffix)

    def state_path(self, key: str) -> Path:
        return self._path(key, _STATE_SUFFIX)

    def bytes_path(self, key: str) -> Path:
        return self._path(key, _BYTES_SUFFIX)

    # -- tensor states -------------------------------------------------------------------

    def put_state(
        self, state: Mapping[str, torch.Tensor], metadata: Mapping[str, Any] | None = None
    ) -> str:
        """Store `state` and return its key (`state_hash(state)`).

        Idempotent: an existing artifact is left as it is, so the first writer's metadata
        wins. An empty state is a valid artifact (e.g. a stateless strategy).
        """
        tensors = prepare_for_save(state)
        key = state_hash(tensors)
        path = self.state_path(key)
        if path.exists():
            return key
        meta = {_META_KEY: json.dumps(dict(metadata or {}), sort_keys=True)}
        atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
        return key

    def get_state(self, key: str) -> dict[str, torch.Tensor]:
        """Load the state stored under `key`, checking its content still hashes to `key`."""
        path = self.state_path(key)
        if not path.exists():
            raise ArtifactError(f"artifact {short(key)} not found in {self.root}")
        try:
            state = load_file(str(path))
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise ArtifactError(
                f"artifact {short(key)} is corrupt ({path}): {type(exc).__name__}: {exc}"
            ) from None
        actual = state_hash(state)
        if actual != key:
            raise ArtifactError(
                f"artifact {short(key)} content does not match its key "
                f"(content hashes to {short(actual)}): file was modified or swapped ({path})"
            )
        return state

    def get_metadata(self, key: str) -> dict[str, Any]:
        """The metadata given to `put_state` (not covered by the content hash)."""
        path = self.state_path(key)
        if not path.exists():
            raise ArtifactError(f"artifact {short(key)} not found in {self.root}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                raw = (fh.metadata() or {}).get(_META_KEY, "{}")
            return json.loads(raw)
        except Exception as exc:
            raise ArtifactError(
                f"artifact {short(key)} has unreadable metadata ({path}): {exc}"
            ) from None

    def has(self, key: str) -> bool:
        """Whether a state is stored under `key` (existence only; `get_state` verifies)."""
        return self.state_path(key).exists()

    # -- raw payloads --------------------------------------------------------------------

    def put_bytes(self, data: bytes) -> str:
        """Store a raw payload under its sha256 and return that key. Idempotent."""
        key = bytes_hash(data)
        path = self.bytes_path(key)
        if not path.exists():
            atomic_write(path, lambda tmp: tmp.write_bytes(data))
        return key

    def get_bytes(self, key: str) -> bytes:
        path = self.bytes_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"payload {short(key)} not found in {self.root}") from None
        actual = bytes_hash(data)
        if actual != key:
            raise ArtifactError(
                f"payload {short(key)} content does not match its key "
                f"(content hashes to {short(actual)}): file was modified or swapped ({path})"
            )
        return data

    def has_bytes(self, key: str) -> bool:
        return self.bytes_path(key).exists()
