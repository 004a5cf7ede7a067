"""Reading a `torch.export.save` archive (.pt2, a zip) without unpickling anything.

`torch.export.load` falls back to `torch.load(weights_only=False)` for members it cannot
read otherwise (sample inputs, pickled weights, custom objects): a buyer's archive could run
code on whoever loads it. This reader takes only what a program needs, as JSON and raw
bytes: the graph (models/NAME.json), the weight and constant configs (JSON) and each
tensor's raw little-endian bytes. A pickled member (a weight or constant with use_pickle,
a custom or opaque object, legacy .pt weights) is refused; sample inputs are never read.

Bounded before anything is decompressed: the archive's size, its member count, each
member's size as read (not as its header claims: a zip bomb lies), and the total.
Standard library only, so that the web process can run it (it imports no torch).
"""

from __future__ import annotations

import io
import json
import posixpath
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_MEMBERS = 4096
# the graph's JSON: a few hundred bytes a node, and MAX_NODES of them (gate.py)
MAX_JSON_BYTES = 64 * 2**20
MAX_CONFIG_BYTES = 16 * 2**20

WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
# members read as text to check the format; everything else is named by the configs
_FORMAT_MEMBERS = {"archive_format": b"pt2", "byteorder": b"little"}
# what torch.export.save writes that a program does not need; never read
_IGNORED_DIRS = ("data/sample_inputs/", "extra/", ".data/")


class ArchiveError(ValueError):
    """The archive cannot be used; the message names the member or limit."""


@dataclass(frozen=True)
class Payload:
    """One weight or constant: its name in the program, its raw bytes and tensor meta."""

    name: str
    data: bytes
    meta: dict[str, Any]  # schema.TensorMeta as JSON: dtype, sizes, strides, offset
    is_param: bool = False


@dataclass(frozen=True)
class Archive:
    program: dict[str, Any]  # models/NAME.json: the serialized ExportedProgram
    weights: dict[str, Payload] = field(default_factory=dict)  # by state-dict name
    constants: dict[str, Payload] = field(default_factory=dict)

    @property
    def payload_bytes(self) -> int:
        return sum(len(p.data) for p in (*self.weights.values(), *self.constants.values()))


def read_archive(source: bytes | Path, max_bytes: int) -> Archive:
    """The program and its tensors from a .pt2 file (bytes or a path) of at most
    `max_bytes`, compressed or not; ArchiveError naming the problem otherwise."""
    size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
    if size > max_bytes:
        raise ArchiveError(f"the program archive is {size:,} bytes; the limit is {max_bytes:,}")
    raw = source if isinstance(source, bytes) else Path(source).read_bytes()
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            return _read(zf, max_bytes)
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"the program is not a readable .pt2 archive (a zip): {exc}") from None
    except ArchiveError:
        raise
    except (EOFError, zipfile.LargeZipFile, NotImplementedError, OSError, RuntimeError,
            ValueError, struct.error) as exc:  # fmt: skip
        # EOFError: a member cut short; NotImplementedError: a compression zipfile lacks;
        # RuntimeError: an encrypted member; ValueError, struct.error: garbled headers
        raise ArchiveError(f"the program archive is damaged or truncated: {exc}") from None


class _Reader:
    """Reads members by their name under the archive's one top folder, counting the bytes
    decompressed so far against the archive's limit."""

    def __init__(self, zf: zipfile.ZipFile, prefix: str, names: set[str], budget: int):
        self.zf, self.prefix, self.names, self.left = zf, prefix, names, budget

    def has(self, name: str) -> bool:
        return name in self.names

    def read(self, name: str, limit: int | None = None) -> bytes:
        if name not in self.names:
            raise ArchiveError(f"the program archive lacks its member {name!r}")
        cap = min(self.left, limit) if limit is not None else self.left
        with self.zf.open(self.prefix + name) as member:
            data = member.read(cap + 1)  # never more than the limit, whatever the header says
        if len(data) > cap:
            which = "its limit" if limit is not None and cap == limit else "the archive's limit"
            raise ArchiveError(f"member {name!r} decompresses past {which} ({cap:,} bytes)")
        self.left -= len(data)
        return data

    def json(self, name: str, limit: int) -> Any:
        try:
            return json.loads(self.read(name, limit))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ArchiveError(f"member {name!r} is not valid JSON: {exc}") from None


def _read(zf: zipfile.ZipFile, max_bytes: int) -> Archive:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ArchiveError(f"the program archive has {len(infos):,} members; the limit is "
                           f"{MAX_MEMBERS:,}")  # fmt: skip
    prefixes = {info.filename.split("/", 1)[0] for info in infos}
    if len(prefixes) != 1 or not all("/" in i.filename for i in infos):
        raise ArchiveError("a .pt2 archive keeps all its members under one top folder")
    prefix = prefixes.pop() + "/"
    names = set()
    for info in infos:
        name = info.filename[len(prefix) :]
        if name != posixpath.normpath(name) or name.startswith(("/", "..")):
            raise ArchiveError(f"member {info.filename!r} has a path outside the archive")
        names.add(name)
    reader = _Reader(zf, prefix, names, max_bytes)
    for name, expected in _FORMAT_MEMBERS.items():
        if reader.has(name) and reader.read(name, 64).strip() != expected:
            raise ArchiveError(f"member {name!r} is not {expected.decode()!r}")
    for legacy in ("data/weights/model.pt", "data/constants/model.pt"):
        if reader.has(legacy):
            raise ArchiveError(f"member {legacy!r} is a pickle (the legacy format), which is "
                               "never loaded; save the program with torch.export.save of "
                               "torch 2.6 or newer")  # fmt: skip
    models = sorted(n for n in names if n.startswith("models/") and n.endswith(".json"))
    if models != ["models/model.json"]:
        raise ArchiveError(f"the archive holds one program, models/model.json; it has {models}")
    program = reader.json("models/model.json", MAX_JSON_BYTES)
    if not isinstance(program, dict) or "graph_module" not in program:
        raise ArchiveError("models/model.json is not a serialized ExportedProgram")
    weights = _payloads(reader, WEIGHTS_CONFIG, "data/weights/", "weight")
    constants = (
        _payloads(reader, CONSTANTS_CONFIG, "data/constants/", "constant")
        if reader.has(CONSTANTS_CONFIG) else {}
    )  # fmt: skip
    return Archive(program=program, weights=weights, constants=constants)


def _payloads(reader: _Reader, config_name: str, folder: str, what: str) -> dict[str, Payload]:
    config = reader.json(config_name, MAX_CONFIG_BYTES)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ArchiveError(f"member {config_name!r} has no 'config' mapping")
    out: dict[str, Payload] = {}
    read: dict[str, bytes] = {}  # tensors sharing a file (aliases) read once
    for fqn, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
            raise ArchiveError(f"{what} {fqn!r}: its config entry has no path_name")
        path = entry["path_name"]
        if entry.get("use_pickle") or path.startswith(("custom_obj_", "opaque_obj_")):
            raise ArchiveError(f"{what} {fqn!r} is stored as a pickle ({folder}{path}), which "
                               "is never loaded: only plain tensors can be read")  # fmt: skip
        if "/" in path or path.startswith("."):
            raise ArchiveError(f"{what} {fqn!r}: path_name {path!r} is not a file name")
        meta = entry.get("tensor_meta")
        if not isinstance(meta, dict):
            raise ArchiveError(f"{what} {fqn!r} has no tensor_meta")
        if path not in read:
            read[path] = reader.read(folder + path)
        out[fqn] = Payload(fqn, read[path], meta, bool(entry.get("is_param")))
    return out
