"""A safetensors file's header read in pure Python: the format is an 8-byte little-endian
length, then that many bytes of JSON naming each tensor's dtype, shape and byte range. The
web process checks an uploaded checkpoint with this alone (it imports no torch or
safetensors: issue 36); the worker checks it again against the built model
(trainer.models.meta_weights)."""

from __future__ import annotations

import json
import math
from pathlib import Path

# bytes per element of the dtypes a checkpoint may hold (trainer.models._SAFETENSORS_DTYPES)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit


class HeaderError(ValueError):
    """The bytes are not a safetensors file this project can read; the message says why."""


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype, shape), checked: the header is JSON of the expected shape, every
    dtype known, every byte range inside the file, of its shape's size, and the ranges tile
    the data without gaps or overlaps (as the safetensors library requires)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise HeaderError(f"the file is {size} bytes, too short for a safetensors header")
        length = int.from_bytes(prefix, "little")
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise HeaderError(f"its header claims {length} bytes; the file is {size} bytes")
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeaderError(f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("its header is not a JSON object")
    data_bytes = size - 8 - length
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    ranges: list[tuple[int, int]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = _entry(name, entry)
        begin, end = offsets
        expected = math.prod(shape) * DTYPE_BYTES[dtype]
        if not 0 <= begin <= end <= data_bytes or end - begin != expected:
            raise HeaderError(f"tensor '{name}': its bytes [{begin}, {end}) do not hold "
                              f"{dtype} {list(shape)} inside the file's {data_bytes}")  # fmt: skip
        ranges.append((begin, end))
        out[name] = (dtype, shape)
    position = 0
    for begin, end in sorted(ranges):
        if begin != position:
            raise HeaderError("its tensors' byte ranges overlap or leave gaps")
        position = end
    if position != data_bytes:
        raise HeaderError(f"its tensors hold {position} bytes of the file's {data_bytes}")
    return out


def _entry(name: str, entry: object) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    if not isinstance(entry, dict):
        raise HeaderError(f"tensor '{name}': its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise HeaderError(f"checkpoint tensor '{name}': dtype {dtype}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise HeaderError(f"tensor '{name}': shape {shape!r} is not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_whole, offsets)):
        raise HeaderError(f"tensor '{name}': data_offsets {offsets!r} is not [begin, end]")
    return dtype, tuple(shape), (offsets[0], offsets[1])


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
