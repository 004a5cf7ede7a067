"""An update as one flat vector and back, and field vectors as safetensors (never pickle)."""

from __future__ import annotations

import numpy as np
import torch
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save

from trainer.secagg.modulus import PRIME
from trainer.secagg.packed import MASKED_KEY


def layout(state: dict[str, torch.Tensor]) -> list[tuple[str, list[int]]]:
    """(name, shape) in sorted name order: every node flattens its update alike."""
    return [(k, list(state[k].shape)) for k in sorted(state)]


def flatten(state: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate(
        [state[k].detach().to(torch.float64).reshape(-1).numpy() for k in sorted(state)]
    )


def unflatten(vector: np.ndarray, shape_of: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, shape in shape_of:
        n = int(np.prod(shape)) if shape else 1
        out[name] = torch.from_numpy(vector[at : at + n].astype(np.float32)).reshape(shape)
        at += n
    if at != len(vector):
        raise ValueError(f"the vector has {len(vector)} values, the layout {at}")
    return out


def encode_masked(vector: np.ndarray, metadata: dict[str, str]) -> bytes:
    """Field elements as uint32 safetensors: 4 bytes each, as a float32 weight."""
    return np_save({MASKED_KEY: vector.astype(np.uint32)}, metadata=metadata)


def decode_masked(data: bytes, length: int) -> np.ndarray:
    """A masked input's field elements; ValueError naming what is wrong with it."""
    try:
        tensors = np_load(data)
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise ValueError(f"not a safetensors file ({exc})") from None
    if set(tensors) != {MASKED_KEY}:
        raise ValueError(f"a masked update holds one tensor named {MASKED_KEY!r}")
    vector = tensors[MASKED_KEY]
    if vector.dtype != np.uint32 or vector.shape != (length,):
        raise ValueError(f"a masked update is {length} uint32 values, not {vector.dtype} "
                         f"{list(vector.shape)}")  # fmt: skip
    out = vector.astype(np.int64)
    if (out >= PRIME).any():
        raise ValueError("a masked update holds values outside the field")
    return out
