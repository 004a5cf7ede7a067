"""scikit-learn's bundled 8x8 handwritten digits: a real dataset that needs no download."""

from __future__ import annotations

import numpy as np

from trainer.datasets.base import Dataset
from trainer.datasets.classification import classification_dataset

# Pixel intensities in load_digits are counts 0..16 (4x4 blocks of a 32x32 bitmap).
_MAX_INTENSITY = 16.0


def load_digits_dataset(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """1797 samples, 64 features in [0, 1], 10 classes, stratified held-out test split.

    The split depends only on (test_fraction, seed), so every node and every run that
    agrees on those two numbers evaluates on exactly the same test samples.
    """
    from sklearn.datasets import load_digits  # here: a node's task never loads digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float64) / _MAX_INTENSITY).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    return classification_dataset("digits", x, y, 10, test_fraction, seed)
