"""Local datasets (federated silos): data the owner keeps on this machine and lets federated
jobs train on, without its rows ever leaving it.

`gpuflex-node datasets add NAME PATH` (or the tray's Datasets page) declares one. It is read
with the trainer's own loaders (trainer.datasets: CSV, NPZ, Parquet, an image folder) in a
child process, as desktop.probe measures the machine: the agent never imports torch. What the
marketplace is told (`advertised`) is the name, the schema (features, classes, columns), the
row count and a content hash, never a row. Declarations live in the agent's settings
(desktop.config.Settings.local_datasets); a task of a federated job reads the file through a
read-only bind into its sandbox (desktop.sandbox), never a download.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from desktop.config import Settings
from desktop.entry import entry_argv

# as the marketplace bounds them (marketplace/nodes/bounds.py): refused here first, clearly
MAX_DATASETS = 32
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
KINDS = ("csv", "npz", "parquet", "image_folder")
SUFFIX_KINDS = {".csv": "csv", ".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}
MAX_CLASS_NAMES = 256  # an image folder's class names are advertised up to this many
MAX_COLUMNS = 256  # a table's column names likewise
INSPECT_TIMEOUT_S = 600.0
_CHUNK = 1 << 20


class DatasetRefused(ValueError):
    """A declaration the agent refuses; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class LocalDataset:
    """One declared dataset: where it is and what reading it found."""

    name: str
    path: str  # absolute
    kind: str
    rows: int
    content_hash: str  # sha256 of the file, or of an image folder's files (content_hash())
    input_shape: list[int]
    num_classes: int
    label_column: str = "label"
    image_size: int = 28
    columns: list[str] = field(default_factory=list)  # a table's columns, label included
    classes: list[str] = field(default_factory=list)  # an image folder's class folder names
    fingerprint: str = ""  # sizes and mtimes when inspected: a cheap "has it changed?"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocalDataset:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def advertised(self) -> dict[str, Any]:
        """What the marketplace learns (docs/agent-api.md, "Local datasets"): never a row,
        and not where the file is."""
        out: dict[str, Any] = {
            "name": self.name, "rows": self.rows, "content_hash": self.content_hash,
            "kind": self.kind, "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
        }  # fmt: skip
        if self.columns:
            out["columns"] = list(self.columns)
        if self.classes:
            out["classes"] = list(self.classes)
        return out

    def changed(self) -> bool:
        """The file (or folder) differs from when it was inspected, by size or mtime."""
        return fingerprint(Path(self.path)) != self.fingerprint


def guess_kind(path: Path) -> str:
    if path.is_dir():
        return "image_folder"
    kind = SUFFIX_KINDS.get(path.suffix.lower())
    if kind is None:
        raise DatasetRefused(
            f"{path}: cannot tell the format from the name; give --kind ({', '.join(KINDS)})"
        )
    return kind


def _files(root: Path) -> list[Path]:
    """An image folder's regular files, in a stable order (symlinks are not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def fingerprint(path: Path) -> str:
    """Sizes and modification times (no content read): what `changed` compares."""
    try:
        if path.is_dir():
            stats = [(str(p.relative_to(path)), p.stat()) for p in _files(path)]
        else:
            stats = [("", path.stat())]
    except OSError:
        return ""
    text = "\n".join(f"{name}\t{st.st_size}\t{st.st_mtime_ns}" for name, st in stats)
    return hashlib.sha256(text.encode()).hexdigest()


def content_hash(path: Path) -> str:
    """sha256 of a file's bytes; for a folder, of each file's relative path and sha256."""
    if not path.is_dir():
        return _sha256(path)
    outer = hashlib.sha256()
    for p in _files(path):
        outer.update(f"{p.relative_to(path).as_posix()}\0{_sha256(p)}\n".encode())
    return outer.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_name(name: str, existing: list[LocalDataset]) -> None:
    if not NAME.match(name):
        raise DatasetRefused(
            f"{name!r} is not a usable dataset name: 1 to 100 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    if any(d.name == name for d in existing):
        raise DatasetRefused(
            f"a dataset named {name!r} is already declared; remove it first "
            f"('gpuflex-node datasets remove {name}') or pick another name"
        )
    if len(existing) >= MAX_DATASETS:
        raise DatasetRefused(f"at most {MAX_DATASETS} local datasets can be declared")


def inspect(
    name: str, path: str | Path, kind: str | None = None, label_column: str = "label",
    image_size: int = 28,
) -> LocalDataset:  # fmt: skip
    """Read the dataset with the trainer's loader in a child process (no torch here) and
    describe it; DatasetRefused names what is wrong (missing, unreadable, not a dataset)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DatasetRefused(f"{path}: no such file or folder")
    path = path.resolve()
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise DatasetRefused(f"{path}: not readable by this user")
    kind = kind or guess_kind(path)
    if kind not in KINDS:
        raise DatasetRefused(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    request = {"path": str(path), "kind": kind, "label_column": label_column,
               "image_size": image_size}  # fmt: skip
    argv = entry_argv("desktop.local_datasets", "_dataset", json.dumps(request))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=INSPECT_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DatasetRefused(f"{path}: reading it took over {INSPECT_TIMEOUT_S:g} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else {}
    except ValueError:
        found = {}
    if done.returncode or "error" in found or "rows" not in found:
        why = found.get("error") or done.stderr.strip()[-500:] or "the reader failed"
        raise DatasetRefused(f"{path} cannot be used as a {kind} dataset: {why}")
    return LocalDataset(
        name=name, path=str(path), kind=kind, label_column=label_column, image_size=image_size,
        rows=int(found["rows"]), input_shape=[int(d) for d in found["input_shape"]],
        num_classes=int(found["num_classes"]), columns=list(found.get("columns") or []),
        classes=list(found.get("classes") or []), content_hash=content_hash(path),
        fingerprint=fingerprint(path),
    )  # fmt: skip


def declared(settings: Settings) -> list[LocalDataset]:
    """The datasets declared in `settings` (a damaged entry is skipped, not fatal)."""
    out = []
    for raw in settings.local_datasets:
        try:
            out.append(LocalDataset.from_dict(raw))
        except (TypeError, ValueError):
            continue
    return out


def find(settings: Settings, name: str) -> LocalDataset | None:
    return next((d for d in declared(settings) if d.name == name), None)


def add(
    settings: Settings, name: str, path: str | Path, kind: str | None = None,
    label_column: str = "label", image_size: int = 28,
) -> LocalDataset:  # fmt: skip
    """Inspect and declare a dataset in `settings` (the caller saves them)."""
    check_name(name, declared(settings))
    dataset = inspect(name, path, kind, label_column, image_size)
    settings.local_datasets = [*settings.local_datasets, dataset.to_dict()]
    return dataset


def replace_entry(settings: Settings, dataset: LocalDataset) -> None:
    """Put a re-inspected `dataset` in place of its old entry (the caller saves)."""
    settings.local_datasets = [
        dataset.to_dict() if d.get("name") == dataset.name else d for d in settings.local_datasets
    ]


def remove(settings: Settings, name: str) -> None:
    """Forget a declared dataset (its file is left alone; the caller saves)."""
    if find(settings, name) is None:
        raise DatasetRefused(f"no local dataset named {name!r} is declared")
    settings.local_datasets = [d for d in settings.local_datasets if d.get("name") != name]


def advertisement(settings: Settings) -> list[dict[str, Any]]:
    """What registration and `PUT agent/datasets` send: every declared dataset's summary."""
    return [d.advertised() for d in declared(settings)]


def _read(request: dict[str, Any]) -> dict[str, Any]:
    """The child's side: load with trainer.datasets and keep only the description."""
    from trainer.datasets import DatasetError, load_dataset
    from trainer.spec import DatasetSpec

    path, kind = Path(request["path"]), request["kind"]
    try:
        spec = DatasetSpec(kind=kind, path=str(path), label_column=request["label_column"],
                           image_size=request["image_size"])  # fmt: skip
        data = load_dataset(spec)
    except (DatasetError, ValueError, OSError) as exc:
        return {"error": str(exc)}
    if data.task != "classification":
        return {"error": "only classification datasets can be declared"}
    out: dict[str, Any] = {
        "rows": data.num_train + data.num_test,
        "input_shape": list(data.input_shape),
        "num_classes": data.num_classes,
    }
    if kind == "image_folder":
        names = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        out["classes"] = [n[:100] for n in names[:MAX_CLASS_NAMES]]
    elif kind in ("csv", "parquet"):
        out["columns"] = [c[:100] for c in _columns(path, kind)[:MAX_COLUMNS]]
    return out


def _columns(path: Path, kind: str) -> list[str]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    import csv

    with path.open(newline="", encoding="utf-8-sig") as f:
        return [c.strip() for c in next(csv.reader(f), [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="desktop.local_datasets")
    parser.add_argument("request", help="JSON: path, kind, label_column, image_size")
    args = parser.parse_args(argv)
    print(json.dumps(_read(json.loads(args.request))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
