"""Content hashes for tensors and state dicts: the identity of models, updates and shards."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import torch

from trainer.digest import bytes_hash  # re-exported: one place for the bytes' hash

__all__ = ["bytes_hash", "state_hash", "tensor_hash"]


def _feed(h: hashlib._Hash, tensor: torch.Tensor) -> None:
    t = tensor.detach().contiguous().cpu()
    h.update(str(t.dtype).encode())
    h.update(repr(tuple(t.shape)).encode())
    # bfloat16 has no numpy dtype; its raw bytes are still well defined as int16
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    h.update(t.numpy().tobytes())


def tensor_hash(tensor: torch.Tensor | np.ndarray) -> str:
    h = hashlib.sha256()
    _feed(h, torch.as_tensor(tensor))
    return h.hexdigest()


def state_hash(state: Mapping[str, torch.Tensor]) -> str:
    """Order-independent: keys are hashed sorted, each with dtype and shape."""
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(b"\0")
        _feed(h, state[key])
    return h.hexdigest()
