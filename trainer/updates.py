"""Model states and updates on the wire: safetensors bytes, parsed and checked before use.

Every payload a node sends is untrusted. It is decoded with safetensors only (never pickle,
never `torch.load`, so decoding cannot run code), its header is read and bounded *before*
any tensor is built, and an update is then checked against the global model it claims to
update: same names, shapes and dtypes, finite values, bounded L2 norm. Anything else is an
`UpdateRejected` whose `reason` is a short code the coordinator can count and report.

Layout of a safetensors payload: an 8-byte little-endian header length N, N bytes of JSON
(``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}}``), then the
tensor data, each tensor at ``data_offsets`` relative to the end of the header.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.torch
import torch
from torch import Tensor

FORMAT = "gpuflex/state-v1"

# safetensors' own ceiling on the JSON header; decode_update sets a far tighter one
MAX_HEADER_BYTES = 100_000_000
# a safetensors header is {name: {"shape": [...]}}: three levels; allow a little slack
MAX_HEADER_DEPTH = 8
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
# caller metadata is small provenance (round, node id, codec); more is abuse, not data
MAX_METADATA_BYTES = 64 * 1024
# header bytes one tensor entry may take beyond its name (dtype, shape, offsets, JSON)
_HEADER_BYTES_PER_TENSOR = 256
_HEADER_BYTES_BASE = 1024

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

REASONS = frozenset(
    {
        "corrupt",
        "missing_keys",
        "unexpected_keys",
        "shape",
        "dtype",
        "non_finite",
        "norm",
        "metadata",
    }
)


class UpdateRejected(ValueError):
    """An encoded state or update that must not be used.

    `reason` is one of `REASONS`, a stable code for counting and reporting; `tensor` is the
    offending tensor's name when there is one. `str()` is a readable message naming it.
    """

    def __init__(self, reason: str, message: str, tensor: str | None = None) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        self.reason = reason
        self.tensor = tensor
        super().__init__(message)


# ---------------------------------------------------------------------------- encoding


def encode_state(state: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise `state` as safetensors bytes tagged with ``{"format": FORMAT}``.

    Tensors are detached, moved to the CPU and made contiguous; tensors sharing storage
    (tied weights, views of one buffer) are copied, since safetensors refuses shared memory.
    """
    meta = _check_metadata_for_encoding(metadata)
    tensors: dict[str, Tensor] = {}
    seen_storage: set[tuple[str, int]] = set()
    for name, tensor in state.items():
        if not isinstance(name, str):
            raise TypeError(f"state keys must be str, got {type(name).__name__}: {name!r}")
        if not isinstance(tensor, Tensor):
            raise TypeError(f"state entry '{name}' is {type(tensor).__name__}, not a tensor")
        if tensor.dtype not in _DTYPE_NAMES:
            raise TypeError(f"state entry '{name}' has unsupported dtype {tensor.dtype}")
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        key = (str(t.device), ptr)
        if ptr != 0 and key in seen_storage:
            t = t.clone()
        else:
            seen_storage.add(key)
        tensors[name] = t
    return safetensors.torch.save(tensors, metadata=meta)


def _check_metadata_for_encoding(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """str -> str only (safetensors' rule), and "format" is ours to set."""
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
        if key == "format" and value != FORMAT:
            raise ValueError(f"metadata key 'format' is reserved for {FORMAT!r}")
        meta[key] = value
    meta["format"] = FORMAT
    if len(json.dumps(meta).encode()) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata larger than {MAX_METADATA_BYTES} bytes")
    return meta


# ---------------------------------------------------------------------------- decoding


def decode_state(data: bytes) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Parse safetensors bytes into (tensors, metadata), checking structure only.

    Never executes anything from the payload. Malformed bytes are `UpdateRejected("corrupt")`,
    a payload without our format tag is `UpdateRejected("metadata")`.
    """
    data = _as_bytes(data)
    entries, metadata = _parse_header(data, MAX_HEADER_BYTES)
    return _load_tensors(data, entries), metadata


def decode_update(
    data: bytes, reference: Mapping[str, Tensor], max_norm: float | None = None
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Decode an update and check it against `reference` (the global model it updates).

    The payload length and the header are checked against the reference *before* any tensor
    is built, so an absurd declared size costs nothing; then `validate_update` runs on the
    tensors.
    """
    data = _as_bytes(data)
    _check_reference(reference)
    header_limit = _header_limit(reference)
    size_limit = 8 + header_limit + sum(_nbytes(t.dtype, t.shape) for t in reference.values())
    if len(data) > size_limit:
        raise UpdateRejected(
            "corrupt",
            f"payload of {len(data)} bytes is larger than any valid update of this model "
            f"(at most {size_limit} bytes)",
        )
    entries, metadata = _parse_header(data, header_limit)
    _check_structure(
        {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in entries.items()},
        reference,
    )
    update = _load_tensors(data, entries)
    validate_update(update, reference, max_norm)
    return update, metadata


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"expected bytes, got {type(data).__name__}")


def _header_limit(reference: Mapping[str, Tensor]) -> int:
    """Generous header size for a model with these tensor names; anything larger is abuse."""
    per_tensor = sum(len(name.encode()) + _HEADER_BYTES_PER_TENSOR for name in reference)
    return _HEADER_BYTES_BASE + MAX_METADATA_BYTES + per_tensor


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...] | torch.Size) -> int:
    return math.prod(shape) * dtype.itemsize


def _parse_header(data: bytes, max_header: int) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Read and check the JSON header without trusting any of it.

    Returns ({name: {"dtype": torch.dtype, "shape": [...], "data_offsets": [b, e]}},
    metadata). Every tensor must lie inside the payload with a byte size that matches its
    shape, so nothing later can allocate more than the payload holds.
    """
    if len(data) < 8:
        raise UpdateRejected("corrupt", f"payload of {len(data)} bytes is too short for a header")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise UpdateRejected(
            "corrupt",
            f"header length {header_len} exceeds the payload ({len(data) - 8} bytes after "
            "the length field)",
        )
    if header_len > max_header:
        raise UpdateRejected(
            "corrupt", f"header of {header_len} bytes exceeds the limit of {max_header}"
        )
    raw = data[8 : 8 + header_len]
    depth = _json_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        # Checked before parsing: a deeply nested header can overflow the C parser's stack
        # (a crash, not a RecursionError) in threads with small stacks, as servers use.
        raise UpdateRejected(
            "corrupt", f"header nests {depth} levels deep; at most {MAX_HEADER_DEPTH} are valid"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UpdateRejected("corrupt", f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise UpdateRejected("corrupt", "header is not a JSON object")
    metadata = _parse_metadata(header.pop("__metadata__", None))
    data_len = len(data) - 8 - header_len
    entries = {name: _parse_entry(name, entry, data_len) for name, entry in header.items()}
    return entries, metadata


def _json_depth(raw: bytes) -> int:
    """Deepest nesting of [ and { outside strings, without recursion (vectorised)."""
    structural = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    opens = (structural == ord("[")) | (structural == ord("{"))
    closes = (structural == ord("]")) | (structural == ord("}"))
    steps = opens.astype(np.int64) - closes.astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def _parse_metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise UpdateRejected("metadata", "header __metadata__ must map str to str")
    if raw.get("format") != FORMAT:
        raise UpdateRejected(
            "metadata", f"payload format is {raw.get('format')!r}, expected {FORMAT!r}"
        )
    return dict(raw)


def _parse_entry(name: str, entry: Any, data_len: int) -> dict[str, Any]:
    """One header entry, checked: known dtype, sane shape, offsets inside the data."""

    def bad(why: str) -> UpdateRejected:
        return UpdateRejected("corrupt", f"tensor '{name}': {why}", tensor=name)

    if not isinstance(entry, dict):
        raise bad("header entry is not an object")
    dtype = _DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise bad(f"unknown dtype {entry.get('dtype')!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise bad(f"invalid shape {shape!r}")
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"invalid data_offsets {offsets!r}")
    if offsets[1] > data_len:
        raise bad(
            f"data [{offsets[0]}, {offsets[1]}) runs past the end of the payload "
            f"({data_len} data bytes; truncated?)"
        )
    if offsets[1] - offsets[0] != _nbytes(dtype, tuple(shape)):
        raise bad(f"shape {shape} of {dtype} does not match {offsets[1] - offsets[0]} data bytes")
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def _load_tensors(data: bytes, entries: Mapping[str, Any]) -> dict[str, Tensor]:
    """Build the tensors with safetensors (pure parsing); its own checks are the last word."""
    try:
        tensors = safetensors.torch.load(data)
    except Exception as exc:  # SafetensorError and friends: any failure here is bad bytes
        raise UpdateRejected("corrupt", f"safetensors could not parse the payload: {exc}") from None
    if tensors.keys() != entries.keys():  # cannot happen unless the two parsers disagree
        raise UpdateRejected("corrupt", "safetensors and header disagree on tensor names")
    return tensors


# -------------------------------------------------------------------------- validation


def _check_reference(reference: Mapping[str, Tensor]) -> None:
    """The reference is ours (the global model): a bad one is a programming error."""
    for name, tensor in reference.items():
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__
            raise TypeError(f"reference tensor '{name}' must be a floating tensor, got {kind}")


def _names(names: set[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_structure(
    found: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], reference: Mapping[str, Tensor]
) -> None:
    """Names, then shapes, then dtypes must match the reference exactly."""
    missing = set(reference) - set(found)
    if missing:
        first = min(missing)
        raise UpdateRejected(
            "missing_keys", f"update is missing tensor(s) {_names(missing)}", tensor=first
        )
    unexpected = set(found) - set(reference)
    if unexpected:
        first = min(unexpected)
        raise UpdateRejected(
            "unexpected_keys", f"update has unexpected tensor(s) {_names(unexpected)}", first
        )
    for name in reference:
        dtype, shape = found[name]
        ref = reference[name]
        if tuple(shape) != tuple(ref.shape):
            raise UpdateRejected(
                "shape",
                f"tensor '{name}' has shape {list(shape)}, expected {list(ref.shape)}",
                name,
            )
        if dtype != ref.dtype:
            raise UpdateRejected(
                "dtype", f"tensor '{name}' has dtype {dtype}, expected {ref.dtype}", name
            )


def validate_update(
    update: Mapping[str, Tensor], reference: Mapping[str, Tensor], max_norm: float | None
) -> None:
    """Raise `UpdateRejected` unless `update` has exactly the reference's names, shapes and
    dtypes, only finite values, and a global L2 norm of at most `max_norm` (None: no bound).
    """
    _check_reference(reference)
    if max_norm is not None and not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm must be a positive finite number or None, got {max_norm}")
    found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for name, tensor in update.items():
        if not isinstance(tensor, Tensor):
            raise UpdateRejected(
                "dtype", f"tensor '{name}' is {type(tensor).__name__}, not a tensor", name
            )
        found[name] = (tensor.dtype, tuple(tensor.shape))
    _check_structure(found, reference)
    for name in reference:
        tensor = update[name].detach()
        if not torch.isfinite(tensor).all():
            nan = int(torch.isnan(tensor).sum())
            inf = int(torch.isinf(tensor).sum())
            raise UpdateRejected(
                "non_finite", f"tensor '{name}' has {nan} NaN and {inf} infinite value(s)", name
            )
    if max_norm is not None:
        _check_norm(update, max_norm)


def _check_norm(update: Mapping[str, Tensor], max_norm: float) -> None:
    """Bound the global L2 norm; the message names the tensor contributing most to it."""
    norms = {name: _tensor_norm(t) for name, t in update.items()}
    total = math.sqrt(math.fsum(n * n for n in norms.values()))
    if total > max_norm:
        worst = max(norms, key=lambda name: norms[name])
        raise UpdateRejected(
            "norm",
            f"update L2 norm {total:.6g} exceeds the limit {max_norm:.6g}; the largest part is "
            f"tensor '{worst}' with norm {norms[worst]:.6g}",
            worst,
        )


# ------------------------------------------------------------------------- arithmetic


def _tensor_norm(tensor: Tensor) -> float:
    # float64 so float16/bfloat16 squares do not overflow and large sums stay accurate
    return float(torch.linalg.vector_norm(tensor.detach(), dtype=torch.float64))


def update_norm(update: Mapping[str, Tensor]) -> float:
    """Global L2 norm of a state dict, as if all tensors were one flat vector."""
    return math.sqrt(math.fsum(_tensor_norm(t) ** 2 for t in update.values()))


def _check_same_keys(a: Mapping[str, Tensor], b: Mapping[str, Tensor], what: str) -> None:
    if a.keys() != b.keys():
        missing, extra = set(b) - set(a), set(a) - set(b)
        raise ValueError(f"{what}: key mismatch (missing {sorted(missing)}, extra {sorted(extra)})")
    for name in a:
        if not a[name].is_floating_point() or not b[name].is_floating_point():
            raise TypeError(f"{what}: tensor '{name}' is not floating")
        if a[name].shape != b[name].shape:
            raise ValueError(
                f"{what}: tensor '{name}' shapes differ: {list(a[name].shape)} vs "
                f"{list(b[name].shape)}"
            )


def delta(local: Mapping[str, Tensor], global_: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The update a node sends: ``local - global_``, in the global model's dtype."""
    _check_same_keys(local, global_, "delta")
    return {
        name: (local[name].detach().to(device=g.device, dtype=g.dtype) - g.detach())
        for name, g in global_.items()
    }


def apply_delta(
    global_: Mapping[str, Tensor], delta: Mapping[str, Tensor], scale: float = 1.0
) -> dict[str, Tensor]:
    """``global_ + scale * delta`` as new tensors in the global model's dtype and device.

    The sum is computed in the wider of the two dtypes (a float64 aggregate is not rounded
    to float32 before it is added), then rounded once.
    """
    _check_same_keys(delta, global_, "apply_delta")
    out: dict[str, Tensor] = {}
    for name, g in global_.items():
        d = delta[name].detach().to(g.device)
        wide = torch.promote_types(g.dtype, d.dtype)
        out[name] = torch.add(g.detach().to(wide), d.to(wide), alpha=scale).to(g.dtype)
    return out
