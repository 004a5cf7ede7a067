"""A text corpus read as documents without numpy or torch: UTF-8 text (one document per
non-empty line) or JSONL (a "text" string per line), each error naming the line. text.py
tokenizes the documents; a web request checks an upload with `documents` alone (issue 36).
"""

from __future__ import annotations

from pathlib import Path

from trainer.datasets.errors import DatasetError
from trainer.nesting import TooDeep, loads_json


def documents(path: Path) -> list[bytes]:
    """The corpus's documents, as load_text_dataset reads them before tokenizing."""
    data = _read_corpus(path)
    return _jsonl_documents(path, data) if is_jsonl(path) else _documents(data)


def is_jsonl(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".jsonl"


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _read_corpus(path: Path) -> bytes:
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DatasetError(f"{path}: {what}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read: {exc.strerror}") from None
    if not data:
        raise DatasetError(f"{path}: empty file")
    nul = data.find(b"\0")
    if nul >= 0:
        raise DatasetError(
            f"{path}: line {_line_of(data, nul)}: NUL byte at offset {nul}; this looks like a "
            "binary file"
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}: line {_line_of(data, exc.start)}: not valid UTF-8 at byte offset "
            f"{exc.start} ({exc.reason}); save the text as UTF-8"
        ) from None
    return data.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not text


def _documents(data: bytes) -> list[bytes]:
    lines = (line.removesuffix(b"\r") for line in data.split(b"\n"))
    return [line for line in lines if line]


def _jsonl_documents(path: Path, data: bytes) -> list[bytes]:
    """Each non-blank line's "text" string, UTF-8 encoded; errors name the line."""
    docs = []
    for number, line in enumerate(data.decode("utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = loads_json(line)
        except (ValueError, TooDeep) as exc:
            raise DatasetError(f"{path}: line {number}: not valid JSON: {exc}") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise DatasetError(
                f'{path}: line {number}: each line is a JSON object with a "text" string'
            )
        if text:
            docs.append(text.encode("utf-8"))
    return docs
