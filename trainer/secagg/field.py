"""The field the masked updates live in, and quantizing float updates into it.

GF(p) with p = 2**32 - 5, the largest prime below 2**32: a field element fits the same 4 bytes
as a float32 weight, so a masked update weighs what a plain one does. Element-wise arithmetic
runs in int64 numpy arrays (two elements add below 2**33, far from overflow).

An update is clipped to [-clip, clip] per coordinate and scaled so that the sum of up to
`count` of them cannot wrap around p/2: the signed sum decodes exactly, and each coordinate
of the mean is off by at most half a quantization step (`quantization_error`).
"""

from __future__ import annotations

import numpy as np

PRIME = 2**32 - 5
HALF = PRIME // 2


def scale_for(count: int, clip: float) -> float:
    """Steps per unit: `count` updates of magnitude `clip` sum to less than p/2."""
    if count < 1 or clip <= 0:
        raise ValueError("secure aggregation needs a positive count and clipping range")
    return float(HALF - count) / (count * clip)


def quantization_error(count: int, clip: float) -> float:
    """The most a coordinate of the decoded mean is off (rounding only; clipping aside)."""
    return 0.5 / scale_for(count, clip)


def quantize(values: np.ndarray, count: int, clip: float) -> np.ndarray:
    """Float values -> field elements (int64 in [0, p)), for a sum over `count` nodes."""
    scaled = np.rint(np.clip(values.astype(np.float64), -clip, clip) * scale_for(count, clip))
    return np.mod(scaled.astype(np.int64), PRIME)


def dequantize_sum(total: np.ndarray, count: int, clip: float) -> np.ndarray:
    """A field sum of quantized values -> their float sum (signed: above p/2 is negative)."""
    signed = np.where(total > HALF, total - PRIME, total).astype(np.float64)
    return signed / scale_for(count, clip)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a + b, PRIME)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a - b, PRIME)
