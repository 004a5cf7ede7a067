"""The in-memory dataset every loader produces and every trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# re-exported: the loaders raise it from here; it lives where the web process can name it
from trainer.datasets.errors import DatasetError as DatasetError

Task = Literal["classification", "language_model"]

# Targets at padded positions of a language-model sample; cross-entropy skips them.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Dataset:
    """Train and held-out test tensors.

    classification: x float32 [N, *input_shape], y int64 [N].
    language_model: x int64 [N, seq_len] byte tokens, y int64 [N, seq_len] (the next byte,
    IGNORE_INDEX on padding); `lengths_*` hold each sample's true length.
    """

    name: str
    task: Task
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    lengths_train: torch.Tensor | None = None
    lengths_test: torch.Tensor | None = None
    # each split's rows' numbers in the source file (int64), where the loader knows them:
    # scoring jobs (trainer.scoring.in_row_order) put every row back in the file's order
    rows_train: torch.Tensor | None = None
    rows_test: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])

    def subset(self, indices: torch.Tensor) -> Dataset:
        """The training rows at `indices` (the test split is kept whole)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        lengths = None if self.lengths_train is None else self.lengths_train[idx]
        return Dataset(
            name=self.name,
            task=self.task,
            x_train=self.x_train[idx],
            y_train=self.y_train[idx],
            x_test=self.x_test,
            y_test=self.y_test,
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            lengths_train=lengths,
            lengths_test=self.lengths_test,
            rows_train=None if self.rows_train is None else self.rows_train[idx],
            rows_test=self.rows_test,
        )
