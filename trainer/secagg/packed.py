"""Field vectors as one Python integer, 64 bits a lane: the agent's side of secure aggregation
without numpy or torch (#32: the agent process loads neither; its tasks do).

Element i of a vector of `length` elements sits in bits [64 i, 64 i + 64) of `bits`. Adding
two such integers adds every lane at once (CPython's big-integer arithmetic runs in C): no
lane ever reaches 2**64, so no carry crosses into the next lane. Reducing mod p = 2**32 - 5
lane by lane uses 2**32 = 5 (mod p): a lane's high half times 5 plus its low half, then one
conditional subtraction of p, found from the carry out of lane + 5.

The same values as field.py's numpy arrays, element for element, and the same masked upload
as vectors.encode_masked (tests/trainer/test_secagg_packed.py). Quantizing is the one
per-element Python loop: clip, scale, round half to even (as numpy's rint), reduce.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainer import tensor_header
from trainer.secagg.modulus import PRIME, scale_for
from trainer.secagg.prg import keystream

MASKED_KEY = "masked"  # the one tensor of a masked upload (vectors.py reads it back)
_LANE = 64
_LOW32 = 0xFFFFFFFF
_LITTLE = sys.byteorder == "little"
# safetensors dtypes (tensor_header.DTYPE_BYTES) -> the array typecode of one value; F16 and
# BF16 have none and are unpacked in _tensor_values
_TYPECODES = {"F64": "d", "F32": "f", "I64": "q", "I32": "i", "I16": "h", "I8": "b",
              "U8": "B", "BOOL": "B"}  # fmt: skip


@dataclass(frozen=True)
class Packed:
    """`length` field elements in [0, p), 64 bits each, in one integer."""

    bits: int
    length: int


def _lanes(length: int, value: int) -> int:
    """`value` (below 2**64) in every one of `length` lanes."""
    return int.from_bytes(value.to_bytes(8, "little") * length, "little")


def _reduce_once(bits: int, length: int) -> int:
    """Lanes in [0, 2p) -> [0, p): subtract p where lane + 5 carries into bit 32."""
    ones = _lanes(length, 1)
    carry = ((bits + 5 * ones) >> 32) & ones
    return bits - carry * PRIME


def _reduce(bits: int, length: int) -> int:
    """Lanes of any 64-bit value -> [0, p)."""
    low = _lanes(length, _LOW32)
    for _ in range(2):  # < 2**64 -> < 6 * 2**32 -> < 2**32 + 30, which is below 2p
        bits = 5 * ((bits >> 32) & low) + (bits & low)
    return _reduce_once(bits, length)


def from_elements(values: Iterable[int], length: int) -> Packed:
    """Field elements (ints in [0, p)) packed, in order."""
    words = array("Q", values)
    if len(words) != length:
        raise ValueError(f"{len(words)} elements, not {length}")
    if not _LITTLE:
        words.byteswap()
    return Packed(int.from_bytes(words.tobytes(), "little"), length)


def elements(vector: Packed) -> list[int]:
    words = array("Q", vector.bits.to_bytes(8 * vector.length, "little"))
    if not _LITTLE:
        words.byteswap()
    return words.tolist()


def expand(seed: bytes, length: int) -> Packed:
    """`length` field elements from a 32-byte seed: field.expand's values (prg.py)."""
    return Packed(_reduce(int.from_bytes(keystream(seed, length), "little"), length), length)


def add(a: Packed, b: Packed) -> Packed:
    _same_length(a, b)
    return Packed(_reduce_once(a.bits + b.bits, a.length), a.length)


def sub(a: Packed, b: Packed) -> Packed:
    """a + (p - b): every lane of p - b lies in (0, p], so nothing borrows across lanes."""
    _same_length(a, b)
    negated = _lanes(a.length, PRIME) - b.bits
    return Packed(_reduce_once(a.bits + negated, a.length), a.length)


def _same_length(a: Packed, b: Packed) -> None:
    if a.length != b.length:
        raise ValueError(f"field vectors of {a.length} and {b.length} elements")


def mask(quantized: Packed, terms: Sequence[tuple[bytes, int]]) -> Packed:
    """The masked input: each (seed, sign) of Participant.mask_terms() added or taken away."""
    y = quantized
    for seed, sign in terms:
        m = expand(seed, quantized.length)
        y = add(y, m) if sign > 0 else sub(y, m)
    return y


def quantize(values: Sequence[float], count: int, clip: float) -> Packed:
    """Float values -> field elements, for a sum over `count` nodes: field.quantize's values
    (Python's round() rounds half to even, as numpy's rint does)."""
    scale = scale_for(count, clip)
    low = -clip
    try:
        out = [round(min(max(v, low), clip) * scale) % PRIME for v in values]
    except ValueError:  # round(nan)
        raise ValueError("the update holds a value that is not a number") from None
    return from_elements(out, len(out))


def encode_masked(vector: Packed, metadata: dict[str, str]) -> bytes:
    """Field elements as one uint32 safetensors tensor, as vectors.encode_masked writes them
    (its metadata in sorted order; safetensors' own order is its hash map's)."""
    words = array("Q", vector.bits.to_bytes(8 * vector.length, "little"))
    if not _LITTLE:
        words.byteswap()
    data = array("I", words)  # every element is below p < 2**32
    if not _LITTLE:
        data.byteswap()
    n = vector.length
    header = {
        "__metadata__": dict(sorted(metadata.items())),
        MASKED_KEY: {"dtype": "U32", "shape": [n], "data_offsets": [0, 4 * n]},
    }
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text + data.tobytes()


def flatten_update(data: bytes) -> tuple[list[float], dict[str, str]]:
    """A plain update (safetensors) -> (its values as floats, tensors in sorted name order,
    as vectors.flatten orders them; its metadata). ValueError names what is malformed."""
    try:
        entries, metadata, body = tensor_header.split(data)
    except tensor_header.HeaderError as exc:
        raise ValueError(f"the update is not a safetensors file it can read: {exc}") from None
    values: list[float] = []
    for name in sorted(entries):
        values.extend(_tensor_values(entries[name], body))
    return values, metadata


def _tensor_values(entry: tensor_header.Entry, body: memoryview) -> list[float]:
    count, raw = math.prod(entry.shape), body[entry.begin : entry.end]
    if entry.dtype == "F16":
        return list(struct.unpack(f"<{count}e", raw))
    if entry.dtype == "BF16":  # bfloat16 is the top half of a float32
        widened = struct.pack(f"<{count}I", *(h << 16 for h in struct.unpack(f"<{count}H", raw)))
        return list(struct.unpack(f"<{count}f", widened))
    typed = array(_TYPECODES[entry.dtype])
    typed.frombytes(raw)
    if not _LITTLE:
        typed.byteswap()
    return [float(v) for v in typed]
