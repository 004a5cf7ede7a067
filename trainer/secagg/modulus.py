"""GF(p), the field the masked updates live in, and the scale that quantizes float updates
into it: the facts both arithmetic paths share (numpy arrays in field.py for the server and
the simulator, packed integers in packed.py for the agent, which loads no numpy).

p = 2**32 - 5, the largest prime below 2**32: a field element fits the same 4 bytes as a
float32 weight, so a masked update weighs what a plain one does.

An update is clipped to [-clip, clip] per coordinate and scaled so that the sum of up to
`count` of them cannot wrap around p/2: the signed sum decodes exactly, and each coordinate
of the mean is off by at most half a quantization step (`quantization_error`).
"""

from __future__ import annotations

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
