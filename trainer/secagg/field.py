"""Field vectors as numpy arrays: quantizing float updates into GF(p) (trainer/secagg/
modulus.py), mask expansion and element-wise arithmetic, for the server and the simulator.
The agent does the same on packed integers (packed.py), without numpy; the two agree
(tests/trainer/test_secagg_packed.py).

Element-wise arithmetic runs in int64 arrays (two elements add below 2**33, far from
overflow).
"""

from __future__ import annotations

import numpy as np

from trainer.secagg.modulus import HALF, PRIME, quantization_error, scale_for
from trainer.secagg.prg import keystream

__all__ = ["HALF", "PRIME", "add", "dequantize_sum", "expand", "quantization_error", "quantize",
           "scale_for", "sub"]  # fmt: skip


def quantize(values: np.ndarray, count: int, clip: float) -> np.ndarray:
    """Float values -> field elements (int64 in [0, p)), for a sum over `count` nodes."""
    scaled = np.rint(np.clip(values.astype(np.float64), -clip, clip) * scale_for(count, clip))
    return np.mod(scaled.astype(np.int64), PRIME)


def dequantize_sum(total: np.ndarray, count: int, clip: float) -> np.ndarray:
    """A field sum of quantized values -> their float sum (signed: above p/2 is negative)."""
    signed = np.where(total > HALF, total - PRIME, total).astype(np.float64)
    return signed / scale_for(count, clip)


def expand(seed: bytes, length: int) -> np.ndarray:
    """`length` field elements (int64 in [0, p)) from a 32-byte seed (prg.py)."""
    words = np.frombuffer(keystream(seed, length), dtype="<u8")
    return (words % np.uint64(PRIME)).astype(np.int64)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a + b, PRIME)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a - b, PRIME)
