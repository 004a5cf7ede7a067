"""Dataset loaders: every kind a job spec can name, behind one `load_dataset` call."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.datasets.errors import ArchiveLimits, ArchiveTooLarge, DatasetError
from trainer.spec import DatasetSpec

if TYPE_CHECKING:
    from trainer.datasets.base import Dataset

# The loaders (torch, numpy, PIL) load on first use: the web process names DatasetError and
# the archive limits from here, or a submodule such as trainer.datasets.tokenizer, and must
# not pay for torch (issue 36).
_LAZY = {
    "IGNORE_INDEX": "trainer.datasets.base",
    "Dataset": "trainer.datasets.base",
    "load_image_archive": "trainer.datasets.archives",
    "load_digits_dataset": "trainer.datasets.digits",
    "load_image_folder": "trainer.datasets.images",
    "load_csv_dataset": "trainer.datasets.tabular",
    "load_npz_dataset": "trainer.datasets.tabular",
    "load_parquet_dataset": "trainer.datasets.tabular",
    "load_text_dataset": "trainer.datasets.text",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "IGNORE_INDEX",
    "ArchiveLimits",
    "ArchiveTooLarge",
    "Dataset",
    "DatasetError",
    "load_csv_dataset",
    "load_dataset",
    "load_digits_dataset",
    "load_image_archive",
    "load_image_folder",
    "load_npz_dataset",
    "load_parquet_dataset",
    "load_text_dataset",
]


def load_dataset(
    spec: DatasetSpec,
    seed: int = 0,
    base_dir: Path | None = None,
    archive_limits: ArchiveLimits | None = None,
) -> Dataset:
    """Load what `spec` describes; relative paths are resolved against `base_dir`
    (normally the folder of the job spec file) when given, else the working directory.
    `archive_limits`: what an image archive may hold (trainer/datasets/archives.py)."""
    from trainer.datasets.archives import load_image_archive
    from trainer.datasets.digits import load_digits_dataset
    from trainer.datasets.images import load_image_folder
    from trainer.datasets.tabular import load_csv_dataset, load_npz_dataset, load_parquet_dataset
    from trainer.datasets.text import load_text_dataset

    if spec.kind == "digits":
        return load_digits_dataset(spec.test_fraction, seed)
    path = _resolve(spec, base_dir)
    fraction = spec.test_fraction
    if spec.kind == "csv":
        return load_csv_dataset(path, spec.label_column, fraction, seed)
    if spec.kind == "npz":
        return load_npz_dataset(path, spec.label_column, fraction, seed)
    if spec.kind == "parquet":
        return load_parquet_dataset(path, spec.label_column, fraction, seed)
    if spec.kind == "image_folder":
        if path.is_file():
            return load_image_archive(path, spec.image_size, fraction, seed, archive_limits)
        return load_image_folder(path, spec.image_size, fraction, seed)
    if spec.kind == "text":
        tokenizer = _resolve_path(spec.tokenizer, base_dir) if spec.tokenizer else None
        return load_text_dataset(path, spec.seq_len, fraction, seed, tokenizer)
    raise DatasetError(f"unknown dataset kind {spec.kind!r}")


def _resolve(spec: DatasetSpec, base_dir: Path | None) -> Path:
    if not spec.path:
        raise DatasetError(f"dataset kind {spec.kind!r} needs a 'path'")
    return _resolve_path(spec.path, base_dir)


def _resolve_path(name: str, base_dir: Path | None) -> Path:
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path
