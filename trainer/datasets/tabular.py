"""Tabular user data: CSV, NPZ and Parquet files of features plus one label column."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from trainer.datasets.base import Dataset, DatasetError
from trainer.datasets.classification import classification_dataset, encode_labels
from trainer.datasets.csv_rows import _read_csv, _require_file
from trainer.datasets.csv_rows import check_csv_head as check_csv_head

# -- feature validation ----------------------------------------------------------------------


def _parse_column(values: Sequence[object], column: str, source: str) -> np.ndarray:
    """One feature column as float64; names the first row that is not a number."""
    if not isinstance(values, np.ndarray):
        # numpy would silently turn None (a Parquet null) into NaN
        missing = next((i for i, v in enumerate(values) if v is None), None)
        if missing is not None:
            raise DatasetError(f"{source}: column {column!r}, row {missing + 1}: missing value")
    try:
        return np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError):
        pass
    # Slow path only to find the culprit for the message.
    for row, value in enumerate(values):
        try:
            float(value)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            shown = "an empty value" if value == "" else repr(value)
            raise DatasetError(
                f"{source}: column {column!r}, row {row + 1}: {shown} is not a number"
            ) from None
    raise DatasetError(f"{source}: column {column!r} is not numeric")


def _check_finite(x: np.ndarray, source: str, columns: Sequence[str] | None = None) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        row, *rest = np.argwhere(bad)[0]
        where = f"row {row + 1}"
        if columns is not None:
            where = f"column {columns[rest[0]]!r}, {where}"
        elif rest:
            where = f"sample {row}, position {tuple(int(i) for i in rest)}"
        raise DatasetError(f"{source}: {where} holds a non-finite value ({x[tuple([row, *rest])]})")
    with np.errstate(over="ignore"):
        if not np.isfinite(x.astype(np.float32)).all():
            raise DatasetError(f"{source}: a feature value is too large for float32")


def _features_and_labels(
    columns: dict[str, Sequence[object]], label_column: str, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Column-oriented raw values -> (float32 features [N, F], raw label values [N])."""
    if label_column not in columns:
        names = ", ".join(repr(c) for c in columns) or "none"
        raise DatasetError(f"{source}: no label column {label_column!r}; the columns are: {names}")
    feature_names = [c for c in columns if c != label_column]
    if not feature_names:
        raise DatasetError(f"{source}: no feature columns besides {label_column!r}")
    x = np.stack([_parse_column(columns[c], c, source) for c in feature_names], axis=1)
    _check_finite(x, source, feature_names)
    labels = columns[label_column]
    if not isinstance(labels, np.ndarray):  # arrays come from null-free numeric columns
        missing = [i for i, v in enumerate(labels) if v is None or (isinstance(v, str) and not v)]
        if missing:
            raise DatasetError(f"{source}: row {missing[0] + 1} has no label")
    return x.astype(np.float32), np.asarray(labels)


def _finish(
    path: Path, x: np.ndarray, raw_labels: np.ndarray, test_fraction: float, seed: int
) -> Dataset:
    labels, classes = encode_labels(raw_labels, str(path))
    return classification_dataset(path.name, x, labels, len(classes), test_fraction, seed)


# -- CSV -------------------------------------------------------------------------------------


def load_csv_dataset(
    path: str | Path, label_column: str = "label", test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """A CSV file with a header row; every column but `label_column` is a numeric feature."""
    path = Path(path)
    header, rows = _read_csv(path)
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    x, labels = _features_and_labels(columns, label_column, str(path))
    return _finish(path, x, labels, test_fraction, seed)


# -- Parquet ---------------------------------------------------------------------------------


def load_parquet_dataset(
    path: str | Path, label_column: str = "label", test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """A Parquet file; every column but `label_column` is a numeric feature."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    _require_file(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: cannot read Parquet: {exc}") from None
    if table.num_rows == 0:
        raise DatasetError(f"{path}: empty file (no rows)")
    columns: dict[str, Sequence[object]] = {}
    for name in table.column_names:
        col = table.column(name)
        numeric = pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
        if numeric and col.null_count == 0:
            columns[name] = col.to_numpy()  # fast path, no per-value Python objects
        else:
            columns[name] = col.to_pylist()
    x, labels = _features_and_labels(columns, label_column, str(path))
    return _finish(path, x, labels, test_fraction, seed)


# -- NPZ -------------------------------------------------------------------------------------


def load_npz_dataset(
    path: str | Path, label_column: str = "label", test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """An .npz archive with features `x` (or `features`), [N, ...], and labels `y` (or the
    `label_column` name), [N]. Pickled (object) arrays are refused: loading them can run code.
    """
    path = Path(path)
    x, y = _read_npz(path, label_column)
    x = _validate_npz_features(x, path)
    if y.ndim != 1:
        raise DatasetError(f"{path}: labels must be 1-D [N], got shape {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise DatasetError(
            f"{path}: length mismatch: {x.shape[0]} feature rows but {y.shape[0]} labels"
        )
    return _finish(path, x, y, test_fraction, seed)


# An .npz is a zip archive: a few hundred kB can declare gigabytes (a 258 kB upload once
# decompressed to 1.6 GB before it was refused). Decompression stops at a member's declared
# size, and numpy allocates what an array's header declares, so both are checked before a
# byte is inflated.
MAX_NPZ_BYTES = 2**30  # all members together, uncompressed
MAX_NPZ_RATIO = 200  # uncompressed / compressed, for members past RATIO_FREE_BYTES
RATIO_FREE_BYTES = 16 * 2**20  # small members may compress as well as they like (zeros)


def _check_npz_members(f: BinaryIO, path: Path) -> None:
    try:
        archive = zipfile.ZipFile(f)
    except zipfile.BadZipFile:
        f.seek(0)
        return  # not an archive at all: np.load says what it is
    with archive:
        members = archive.infolist()
        total = sum(m.file_size for m in members)
        if total > MAX_NPZ_BYTES:
            raise DatasetError(
                f"{path}: the archive declares {total:,} bytes uncompressed; "
                f"the limit is {MAX_NPZ_BYTES:,}"
            )
        for m in members:
            ratio = m.file_size / max(m.compress_size, 1)
            if m.file_size > RATIO_FREE_BYTES and ratio > MAX_NPZ_RATIO:
                raise DatasetError(
                    f"{path}: member {m.filename!r} expands {ratio:,.0f}x "
                    f"({m.compress_size:,} to {m.file_size:,} bytes); at most "
                    f"{MAX_NPZ_RATIO}x is accepted"
                )
            if m.filename.endswith(".npy"):
                _check_npy_header(archive, m, path)
    f.seek(0)


def _check_npy_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo, path: Path) -> None:
    """The array a member's header declares fits in the bytes the member declares."""
    fmt = np.lib.format
    try:
        with archive.open(member) as fh:
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(fh)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(
            f"{path}: member {member.filename!r} is not a numpy array: {exc}"
        ) from None
    declared = math.prod(shape) * dtype.itemsize
    if not dtype.hasobject and declared > member.file_size:
        raise DatasetError(
            f"{path}: member {member.filename!r} declares a {shape} {dtype} array "
            f"({declared:,} bytes) in {member.file_size:,} bytes"
        )


def _read_npz(path: Path, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    _require_file(path)
    try:
        # Our own handle: np.load(path) leaks its file when the archive turns out corrupt.
        with path.open("rb") as f:
            _check_npz_members(f, path)
            try:
                archive = np.load(f, allow_pickle=False)
            except (ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise DatasetError(f"{path}: cannot read NPZ: {exc}") from None
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DatasetError(f"{path}: is a single .npy array, not an .npz archive")
            with archive:
                x = _npz_array(archive, ("x", "features"), path, "features")
                y = _npz_array(archive, ("y", label_column), path, "labels")
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read NPZ: {exc}") from None
    return x, y


def _npz_array(
    archive: np.lib.npyio.NpzFile, keys: Sequence[str], path: Path, what: str
) -> np.ndarray:
    key = next((k for k in keys if k in archive.files), None)
    if key is None:
        wanted = " or ".join(repr(k) for k in dict.fromkeys(keys))
        present = ", ".join(repr(k) for k in archive.files) or "none"
        raise DatasetError(f"{path}: no {what} array {wanted}; arrays present: {present}")
    try:
        return archive[key]
    except ValueError:
        # np.load without pickle raises this for object arrays, which is what numpy makes of
        # rows of mixed length.
        raise DatasetError(
            f"{path}: array {key!r} is an object array (rows of mixed length?); "
            "only plain numeric arrays are accepted"
        ) from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: cannot read array {key!r}: {exc}") from None


def _validate_npz_features(x: np.ndarray, path: Path) -> np.ndarray:
    if x.ndim < 2:
        raise DatasetError(f"{path}: features must be [N, ...] with N samples, got shape {x.shape}")
    if x.shape[0] == 0:
        raise DatasetError(f"{path}: empty file (no rows)")
    if x.dtype.kind not in "biuf":
        raise DatasetError(f"{path}: features are not numeric (dtype {x.dtype})")
    x = x.astype(np.float64)
    _check_finite(x, str(path))
    return x.astype(np.float32)
