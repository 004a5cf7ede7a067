"""Held-out evaluation, with accuracy kept as an exact fraction for target checks."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn
from torch.nn import functional as F

from trainer.datasets import IGNORE_INDEX, Dataset
from trainer.exported.runtime import is_program, loss_and_logits


@dataclass(frozen=True)
class Evaluation:
    correct: int
    total: int
    loss: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def meets(self, metric: str, value: float) -> bool:
        """Exact: 0.95 on 360 samples means at least 342 correct, never a rounded float."""
        if metric == "accuracy":
            target = Fraction(str(value))
            return self.correct * target.denominator >= target.numerator * self.total
        return self.loss <= value


@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, batch_size: int = 1024, device: torch.device | None = None
) -> Evaluation:
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for start in range(0, dataset.num_test, batch_size):
        x = dataset.x_test[start : start + batch_size].to(device)
        y = dataset.y_test[start : start + batch_size].to(device)
        if is_program(model):  # its own loss; accuracy where it returns logits
            loss, logits = loss_and_logits(model, x, y)
            loss_sum += float(loss) * len(y)
            total += len(y)
            if logits is not None and logits.shape[:-1] == y.shape:  # a class per sample
                correct += int((logits.argmax(-1) == y).sum())
            continue
        logits = model(x)
        if dataset.task == "language_model":
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        loss_sum += float(F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum"))
        mask = y != IGNORE_INDEX
        correct += int((logits.argmax(-1)[mask] == y[mask]).sum())
        total += int(mask.sum())
    model.train(was_training)
    return Evaluation(correct=correct, total=total, loss=loss_sum / max(total, 1))
