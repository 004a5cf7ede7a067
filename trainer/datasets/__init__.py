"""Dataset loaders: every kind a job spec can name, behind one `load_dataset` call."""

from __future__ import annotations

from pathlib import Path

from trainer.datasets.archives import ArchiveLimits, ArchiveTooLarge, load_image_archive
from trainer.datasets.base import IGNORE_INDEX, Dataset, DatasetError
from trainer.datasets.digits import load_digits_dataset
from trainer.datasets.images import load_image_folder
from trainer.datasets.tabular import load_csv_dataset, load_npz_dataset, load_parquet_dataset
from trainer.datasets.text import load_text_dataset
from trainer.spec import DatasetSpec

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
