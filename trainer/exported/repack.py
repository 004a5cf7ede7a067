"""The trained program: the buyer's archive with the job's final weights swapped in.

Standard library only (the web process serves downloads and imports no torch): the job's
model is a safetensors file, whose header is JSON and whose tensors are raw little-endian
bytes, the same bytes a .pt2 archive keeps per weight. Every weight the archive's config
names is rewritten as its own contiguous file; every other member is copied as it was
(the buyer's own sample inputs included: the archive goes back to the buyer, who made them).
"""

from __future__ import annotations

import io
import json
import struct
import zipfile

from trainer.exported.archive import WEIGHTS_CONFIG, ArchiveError

# safetensors dtype name -> schema.ScalarType code (trainer/exported/gate.py)
_CODES = {"F16": 6, "F32": 7, "F64": 8, "BF16": 13, "U8": 1, "I8": 2, "I16": 3, "I32": 4,
          "I64": 5, "BOOL": 12}  # fmt: skip


def _safetensors(data: bytes) -> tuple[dict[str, dict], memoryview]:
    if len(data) < 8:
        raise ArchiveError("the model file is not safetensors")
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    header.pop("__metadata__", None)
    return header, memoryview(data)[8 + size :]


def _contiguous(sizes: list[int]) -> list[dict[str, int]]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append({"as_int": step})
        step *= max(size, 1)
    return strides[::-1]


def with_weights(program: bytes, model: bytes) -> bytes:
    """`program` (a .pt2 archive the gate passed) with the tensors of `model` (safetensors
    by the program's parameter and buffer names) as its weights."""
    tensors, body = _safetensors(model)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(program)) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst,
    ):
        prefix = src.namelist()[0].split("/", 1)[0] + "/"
        config = json.loads(src.read(prefix + WEIGHTS_CONFIG))
        files: dict[str, bytes] = {}
        for i, (name, entry) in enumerate(sorted(config["config"].items())):
            tensor = tensors.get(name)
            if tensor is None:
                raise ArchiveError(f"the trained model lacks the program's weight {name!r}")
            sizes = [int(d["as_int"]) for d in entry["tensor_meta"]["sizes"]]
            if tensor["shape"] != sizes or _CODES.get(tensor["dtype"]) is None:
                raise ArchiveError(f"weight {name!r}: the trained tensor does not fit")
            start, end = tensor["data_offsets"]
            path = f"weight_{i}"
            data = bytes(body[start:end])
            meta = entry["tensor_meta"]
            if meta["dtype"] == 5 and tensor["dtype"] == "F32":  # a counter (gate.py), back
                count = len(data) // 4
                data = struct.pack(f"<{count}q", *(round(v) for v in struct.unpack(
                    f"<{count}f", data)))  # fmt: skip
            else:
                meta["dtype"] = _CODES[tensor["dtype"]]
            files[path] = data
            meta["strides"] = _contiguous(sizes)
            meta["storage_offset"] = {"as_int": 0}
            entry["path_name"] = path
        weights_dir = prefix + "data/weights/"
        for info in src.infolist():
            if info.filename.startswith(weights_dir):
                continue  # the old weights and config: written anew below
            dst.writestr(info, src.read(info))
        for path, data in files.items():
            dst.writestr(weights_dir + path, data)
        dst.writestr(prefix + WEIGHTS_CONFIG, json.dumps(config))
    return out.getvalue()
