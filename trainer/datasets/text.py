"""A text corpus for language modelling: plain UTF-8 text (one document per non-empty line) or
JSONL (one JSON object per line, its "text" field the document), as byte-level tokens
(vocabulary: the 256 byte values) or the ids of a Hugging Face tokenizer.json."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from trainer.datasets.base import IGNORE_INDEX, Dataset, DatasetError
from trainer.datasets.corpus import _documents, _jsonl_documents, _read_corpus
from trainer.datasets.corpus import is_jsonl as is_jsonl
from trainer.datasets.tokenizer import load_tokenizer

VOCAB_SIZE = 256


def load_text_dataset(
    path: str | Path,
    seq_len: int = 64,
    test_fraction: float = 0.2,
    seed: int = 0,
    tokenizer: str | Path | None = None,
) -> Dataset:
    """Each document is cut into samples of up to seq_len + 1 tokens.

    x = tokens[:-1] and y = tokens[1:], padded to seq_len (x with 0, y with IGNORE_INDEX);
    lengths_* hold the number of real positions. A `.jsonl` path is read as JSONL.
    """
    path = Path(path)
    if seq_len < 1:
        raise DatasetError(f"seq_len must be >= 1, got {seq_len}")
    data = _read_corpus(path)
    docs = _jsonl_documents(path, data) if is_jsonl(path) else _documents(data)
    if tokenizer is None:
        vocab = VOCAB_SIZE
        tokens = [np.frombuffer(doc, dtype=np.uint8) for doc in docs]
    else:
        tok = load_tokenizer(tokenizer)
        vocab = tok.get_vocab_size()
        encoded = tok.encode_batch([doc.decode("utf-8") for doc in docs], add_special_tokens=False)
        tokens = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
    chunks = [c for doc in tokens for c in _chunks(doc, seq_len)]
    if len(chunks) < 2:
        raise DatasetError(
            f"{path}: the corpus yields {len(chunks)} sample(s) but at least 2 are needed "
            f"(each document of 2+ tokens gives one sample per {seq_len} tokens)"
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
        num_classes=vocab,
        input_shape=(seq_len,),
        lengths_train=lengths[train],
        lengths_test=lengths[test],
    )


def _chunks(doc: np.ndarray, seq_len: int) -> list[np.ndarray]:
    # Consecutive windows of seq_len + 1 tokens that share one token with the next window
    # (stride seq_len): every token after the first is a target exactly once, so no
    # transition across a window boundary is lost. A 1-token remainder has no target.
    return [
        chunk
        for start in range(0, len(doc), seq_len)
        if len(chunk := doc[start : start + seq_len + 1]) >= 2
    ]


def _pack(
    chunks: list[np.ndarray], seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = len(chunks)
    x = np.zeros((n, seq_len), dtype=np.int64)
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    for i, chunk in enumerate(chunks):
        tokens = chunk.astype(np.int64)
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
