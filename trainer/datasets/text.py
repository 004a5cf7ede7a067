"""A plain-text corpus for byte-level language modelling (vocabulary: the 256 byte values)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from trainer.datasets.base import IGNORE_INDEX, Dataset, DatasetError

VOCAB_SIZE = 256


def load_text_dataset(
    path: str | Path, seq_len: int = 64, test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """Each non-empty line is a document, cut into samples of up to seq_len + 1 bytes.

    x = bytes[:-1] and y = bytes[1:], padded to seq_len (x with 0, y with IGNORE_INDEX);
    lengths_* hold the number of real positions.
    """
    path = Path(path)
    if seq_len < 1:
        raise DatasetError(f"seq_len must be >= 1, got {seq_len}")
    data = _read_corpus(path)
    chunks = [c for line in _documents(data) for c in _chunks(line, seq_len)]
    if len(chunks) < 2:
        raise DatasetError(
            f"{path}: the corpus yields {len(chunks)} sample(s) but at least 2 are needed "
            f"(each non-empty line of 2+ bytes gives one sample per {seq_len} bytes)"
        )
    x, y, lengths = _pack(chunks, seq_len)
    train, test = _split(len(chunks), test_fraction, seed)
    return Dataset(
        name=path.name,
        task="language_model",
        x_train=x[train],
        y_train=y[train],
        x_test=x[test],
        y_test=y[test],
        num_classes=VOCAB_SIZE,
        input_shape=(seq_len,),
        lengths_train=lengths[train],
        lengths_test=lengths[test],
    )


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
        raise DatasetError(f"{path}: NUL byte at offset {nul}; this looks like a binary file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}: not valid UTF-8 at byte offset {exc.start} ({exc.reason})"
        ) from None
    return data


def _documents(data: bytes) -> list[bytes]:
    lines = (line.removesuffix(b"\r") for line in data.split(b"\n"))
    return [line for line in lines if line]


def _chunks(doc: bytes, seq_len: int) -> list[bytes]:
    # Consecutive windows of seq_len + 1 bytes that share one byte with the next window
    # (stride seq_len): every byte after the first is a target exactly once, so no
    # transition across a window boundary is lost. A 1-byte remainder has no target.
    return [
        chunk
        for start in range(0, len(doc), seq_len)
        if len(chunk := doc[start : start + seq_len + 1]) >= 2
    ]


def _pack(chunks: list[bytes], seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = len(chunks)
    x = np.zeros((n, seq_len), dtype=np.int64)
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    for i, chunk in enumerate(chunks):
        tokens = np.frombuffer(chunk, dtype=np.uint8)
        k = tokens.size - 1
        x[i, :k] = tokens[:-1]
        y[i, :k] = tokens[1:]
        lengths[i] = k
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(lengths)


def _split(n: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random test fraction (no stratification: there are no classes)."""
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    # At least one sample on each side, so both training and evaluation have data.
    n_test = min(max(math.ceil(test_fraction * n), 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    test = np.sort(order[:n_test])
    train = np.sort(order[n_test:])
    return torch.from_numpy(train), torch.from_numpy(test)
