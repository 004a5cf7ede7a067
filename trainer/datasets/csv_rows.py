"""CSV files read without numpy or torch: the rows as text, and the checks a web request
makes before anything is stored (the web process imports neither: issue 36). The loader in
tabular.py reads its rows here and turns them into tensors; `check_csv_values` checks, with
the same rules and messages, what that loader would refuse in the values."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from trainer.datasets.errors import DatasetError

FLOAT32_MAX = 3.4028234663852886e38


def _require_file(path: Path) -> None:
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DatasetError(f"{path}: {what}")


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    _require_file(path)
    try:
        # utf-8-sig: spreadsheet exports often start with a byte-order mark
        with path.open(newline="", encoding="utf-8-sig") as f:
            lines = [row for row in csv.reader(f) if row]  # skip blank lines
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read CSV: {exc}") from None
    if not lines:
        raise DatasetError(f"{path}: empty file (no header, no rows)")
    header = [name.strip() for name in lines[0]]
    if len(set(header)) != len(header):
        dupes = sorted({h for h in header if header.count(h) > 1})
        raise DatasetError(f"{path}: duplicate column names {dupes}")
    rows = lines[1:]
    if not rows:
        raise DatasetError(f"{path}: empty file (a header but no data rows)")
    for number, row in enumerate(rows, start=1):
        if len(row) != len(header):
            raise DatasetError(
                f"{path}: row {number} has {len(row)} fields but the header has {len(header)}"
            )
    return header, [[v.strip() for v in row] for row in rows]


def check_csv_head(head: bytes, whole: bool, source: str) -> None:
    """What the start of a CSV file already says is wrong, before the rest is sent (an
    upload's first chunk): not UTF-8, a field over the csv module's field limit, duplicate
    header names, a row whose field count is not the header's; `whole`: `head` is all of
    the file. The same rules and messages as reading the file whole (`_read_csv`); the
    columns' values and the label column are the spec's to judge, later."""
    if not whole:  # only whole lines; the last record may still be cut (a quoted newline)
        head = head[: head.rfind(b"\n") + 1]
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{source}: cannot read CSV: {exc}") from None
    records: list[list[str]] = []
    try:
        records = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    except csv.Error as exc:
        # a field over the limit is over it whatever follows; other errors may be the cut
        if whole or "field limit" in str(exc):
            raise DatasetError(f"{source}: cannot read CSV: {exc}") from None
    if whole and not records:
        raise DatasetError(f"{source}: empty file (no header, no rows)")
    if not records:
        return
    header = [name.strip() for name in records[0]]
    if len(set(header)) != len(header):
        dupes = sorted({h for h in header if header.count(h) > 1})
        raise DatasetError(f"{source}: duplicate column names {dupes}")
    complete = records[1:] if whole else records[1:-1]
    for number, row in enumerate(complete, start=1):
        if len(row) != len(header):
            raise DatasetError(
                f"{source}: row {number} has {len(row)} fields but the header has {len(header)}"
            )


def check_csv_values(path: Path, label_column: str, source: str) -> int:
    """What load_csv_dataset refuses in a CSV file's values, found without numpy: no label
    column, no feature column, a value that is not a number or not finite (or too large for
    float32), a row without a label. Returns the number of data rows. Messages name `source`
    (the buyer's name for the file), as the loader's do once the file is renamed."""
    try:
        header, rows = _read_csv(path)
    except DatasetError as exc:
        raise DatasetError(str(exc).replace(str(path), source)) from None
    if label_column not in header:
        names = ", ".join(repr(c) for c in header) or "none"
        raise DatasetError(f"{source}: no label column {label_column!r}; the columns are: {names}")
    features = [(i, name) for i, name in enumerate(header) if name != label_column]
    if not features:
        raise DatasetError(f"{source}: no feature columns besides {label_column!r}")
    for i, name in features:  # column by column, as the loader parses them
        for number, row in enumerate(rows, start=1):
            value = row[i]
            try:
                parsed = float(value)
            except ValueError:
                shown = "an empty value" if value == "" else repr(value)
                raise DatasetError(
                    f"{source}: column {name!r}, row {number}: {shown} is not a number"
                ) from None
            if not math.isfinite(parsed):
                raise DatasetError(
                    f"{source}: column {name!r}, row {number} holds a non-finite value ({parsed})"
                )
    if any(abs(float(row[i])) > FLOAT32_MAX for i, _ in features for row in rows):
        raise DatasetError(f"{source}: a feature value is too large for float32")
    label = header.index(label_column)
    missing = next((n for n, row in enumerate(rows, start=1) if not row[label]), None)
    if missing is not None:
        raise DatasetError(f"{source}: row {missing} has no label")
    return len(rows)
