"""A safetensors file's header read in pure Python: the format is an 8-byte little-endian
length, then that many bytes of JSON naming each tensor's dtype, shape and byte range. The
web process checks an uploaded checkpoint with this alone (it imports no torch or
safetensors: issue 36; the worker checks it again against the built model,
trainer.models.meta_weights), and the agent reads a plain update with it for secure
aggregation (trainer.secagg.packed: the agent imports neither either)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# bytes per element of the dtypes a checkpoint may hold (trainer.models._SAFETENSORS_DTYPES)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip
# what a node's upload may hold: those (trainer.updates decodes them in every codec) and a
# masked input's U32 (trainer.secagg.packed); which of them a payload may hold is its
# decoder's rule, checked by the worker
UPLOAD_DTYPE_BYTES = DTYPE_BYTES | {"U32": 4}
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit


class HeaderError(ValueError):
    """The bytes are not a safetensors file this project can read; the message says why."""


@dataclass(frozen=True)
class Entry:
    """One tensor as the header names it: dtype, shape and its byte range in the data."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype, shape), checked (`parse`), reading only the header's bytes."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        length = _length(fh.read(8), size)
        raw = fh.read(length)
    entries, _ = parse(raw, size - 8 - length)
    return {name: (e.dtype, e.shape) for name, e in entries.items()}


def split(
    data: bytes, dtypes: dict[str, int] = DTYPE_BYTES
) -> tuple[dict[str, Entry], dict[str, str], memoryview]:
    """A safetensors file held in memory: its checked entries, its metadata and its data
    (the entries' ranges index it). `dtypes`: those it may hold, and their sizes."""
    length = _length(data[:8], len(data))
    entries, metadata = parse(data[8 : 8 + length], len(data) - 8 - length, dtypes)
    return entries, metadata, memoryview(data)[8 + length :]


def parse(
    raw: bytes, data_bytes: int, dtypes: dict[str, int] = DTYPE_BYTES
) -> tuple[dict[str, Entry], dict[str, str]]:
    """The header's JSON, checked: an object of entries, every dtype known, every byte range
    inside the `data_bytes` after it and of its shape's size, and the ranges tiling the data
    without gaps or overlaps (as the safetensors library requires); and its metadata."""
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeaderError(f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise HeaderError("its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    out: dict[str, Entry] = {}
    for name, item in header.items():
        entry = _entry(name, item, dtypes)
        expected = math.prod(entry.shape) * dtypes[entry.dtype]
        if not 0 <= entry.begin <= entry.end <= data_bytes or entry.end - entry.begin != expected:
            raise HeaderError(f"tensor '{name}': its data does not match its {entry.dtype} "
                              f"{list(entry.shape)} (bytes [{entry.begin}, {entry.end}) of "
                              f"the file's {data_bytes})")  # fmt: skip
        out[name] = entry
    position = 0
    for begin, end in sorted((e.begin, e.end) for e in out.values()):
        if begin != position:
            raise HeaderError("its tensors' byte ranges overlap or leave gaps")
        position = end
    if position != data_bytes:
        raise HeaderError(f"its tensors hold {position} bytes of the file's {data_bytes}")
    return out, metadata


def _length(prefix: bytes, size: int) -> int:
    """The header's length from the file's first 8 bytes, checked against the file's size."""
    if len(prefix) < 8:
        raise HeaderError(f"the file is {size} bytes, too short for a safetensors header")
    length = int.from_bytes(prefix, "little")
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise HeaderError(f"its header runs past its end: it claims {length} bytes; the file "
                          f"is {size} bytes")  # fmt: skip
    return length


def _entry(name: str, entry: object, dtypes: dict[str, int]) -> Entry:
    if not isinstance(entry, dict):
        raise HeaderError(f"tensor '{name}': its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in dtypes:
        raise HeaderError(f"checkpoint tensor '{name}': dtype {dtype}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise HeaderError(f"tensor '{name}': shape {shape!r} is not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_whole, offsets)):
        raise HeaderError(f"tensor '{name}': data_offsets {offsets!r} is not [begin, end]")
    return Entry(dtype, tuple(shape), offsets[0], offsets[1])


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
