"""The train/test split and label encoding every classification loader shares.

Digits, tabular files and image folders all go through here, so they split the same way.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from trainer.datasets.base import Dataset, DatasetError


def train_test_indices(
    labels: np.ndarray | None, n: int, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) row indices; stratified on `labels` when that is possible.

    sklearn refuses to stratify when a class has < 2 samples or when either side of the
    split is smaller than the number of classes; we then fall back to a plain seeded random
    split instead of failing, because tiny user datasets are legitimate for smoke tests.
    """
    # sklearn costs a second to import; only loading a dataset needs it, not a node's task
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    n_test = math.ceil(test_fraction * n)  # the same rounding sklearn uses
    if n < 2 or n - n_test < 1:
        raise DatasetError(
            f"{n} sample(s) are too few to hold out a test fraction of {test_fraction}"
        )
    stratify = labels if labels is not None and _can_stratify(labels, n_test, n - n_test) else None
    train, test = train_test_split(
        np.arange(n), test_size=test_fraction, random_state=seed, stratify=stratify
    )
    # Sorted so x_train keeps the file's row order: easier to inspect, and shards are
    # defined by index anyway.
    return np.sort(train).astype(np.int64), np.sort(test).astype(np.int64)


def _can_stratify(labels: np.ndarray, n_test: int, n_train: int) -> bool:
    _, counts = np.unique(labels, return_counts=True)
    return bool(counts.min() >= 2 and n_test >= counts.size and n_train >= counts.size)


def encode_labels(values: np.ndarray, source: str) -> tuple[np.ndarray, list[object]]:
    """Map raw labels (ints, floats or strings) to 0..K-1 in sorted order.

    Strings that all parse as numbers are sorted numerically ("10" after "9").
    """
    values = _numeric_if_possible(np.asarray(values))
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        raise DatasetError(f"{source}: label of row {bad + 1} is {values[bad]}")
    classes, codes = np.unique(values, return_inverse=True)
    if classes.size < 2:
        only = classes[0].item() if classes.size else None
        raise DatasetError(
            f"{source}: only one class (label {only!r}); classification needs at least 2"
        )
    return codes.astype(np.int64), [c.item() for c in classes]


def _numeric_if_possible(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind not in "USO":
        return values
    # Via text, so an object array of floats is not silently truncated by astype(int64).
    values = values.astype(str)
    try:
        return values.astype(np.int64)
    except (ValueError, TypeError, OverflowError):
        pass
    try:
        floats = values.astype(np.float64)
    except (ValueError, TypeError, OverflowError):
        return values.astype(str)
    # "1.0" and "1" name the same class; keep big or fractional values as floats
    whole = np.all(floats == np.round(floats)) and np.all(np.abs(floats) < 2**53)
    return floats.astype(np.int64) if whole else floats


def classification_dataset(
    name: str,
    x: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    test_fraction: float,
    seed: int,
) -> Dataset:
    """Split validated float32 features and int64 labels into a Dataset."""
    train, test = train_test_indices(labels, int(x.shape[0]), test_fraction, seed)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    tr, te = torch.from_numpy(train), torch.from_numpy(test)
    return Dataset(
        name=name,
        task="classification",
        x_train=xt[tr],
        y_train=yt[tr],
        x_test=xt[te],
        y_test=yt[te],
        num_classes=num_classes,
        input_shape=tuple(int(d) for d in x.shape[1:]),
        rows_train=tr,
        rows_test=te,
    )
