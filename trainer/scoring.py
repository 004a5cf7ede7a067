"""Scoring a finished model over a dataset, split into tasks: evaluation and inference.

Evaluation: a node scores its rows and returns their sums: the per-sample losses' exact sum
(as Shewchuk partials: float64s whose exact sum is the sum of every sample's loss), the
correct count and the number scored. The server merges the partials of every task and rounds
once (`combine`), so the distributed score is the same number a single process gets by
summing every sample's loss (`score` over all the rows): no float is rounded per task.

Both kinds run their rows in batches of `SCORE_BATCH` from the first row of the task, and the
marketplace cuts a scoring job's tasks at multiples of it, so every batch a node computes is a
batch a single process over all the rows computes too: the per-sample values are the same
bits on the same device.

Inference: a node returns its rows' predicted class and class probabilities. Both results
travel as safetensors (trainer.updates' format), never pickle, and are checked here before
the server keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from trainer.datasets import IGNORE_INDEX, Dataset
from trainer.evaluate import Evaluation
from trainer.updates import UpdateRejected, decode_state, encode_state

# rows per forward pass; scoring tasks start at multiples of it (see the module docstring)
SCORE_BATCH = 256
# a float64 sum has at most ~40 non-overlapping partials; more is not an honest result
MAX_PARTIALS = 64


class ScoringRejected(ValueError):
    """A node's scoring result that cannot be used; the message says why."""


def _msum_add(partials: list[float], x: float) -> None:
    """Add `x` to `partials` exactly (Shewchuk's algorithm, as in math.fsum)."""
    i = 0
    for y in list(partials):
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def exact_partials(values: Iterable[float]) -> tuple[float, ...]:
    partials: list[float] = []
    for v in values:
        _msum_add(partials, float(v))
    return tuple(partials)


@dataclass(frozen=True)
class ScoreSums:
    """What one evaluation task returns, or the combination of several."""

    partials: tuple[float, ...]  # the loss sum, exactly: non-overlapping float64 partials
    correct: int
    count: int  # samples scored (tokens, for a language model)

    @property
    def loss_sum(self) -> float:
        return math.fsum(self.partials)

    @property
    def evaluation(self) -> Evaluation:
        return Evaluation(self.correct, self.count, self.loss_sum / max(self.count, 1))

    def to_bytes(self, metadata: dict[str, str] | None = None) -> bytes:
        tensors = {
            "loss_partials": torch.tensor(self.partials or (0.0,), dtype=torch.float64),
            "correct": torch.tensor([self.correct], dtype=torch.int64),
            "count": torch.tensor([self.count], dtype=torch.int64),
        }
        return encode_state(tensors, {"kind": "evaluate", **(metadata or {})})

    @classmethod
    def from_bytes(cls, data: bytes, expected_count: int | None = None) -> ScoreSums:
        tensors = _decoded(data, "evaluate", {"loss_partials", "correct", "count"})
        partials, correct, count = (
            tensors["loss_partials"], tensors["correct"], tensors["count"]
        )  # fmt: skip
        if partials.dtype != torch.float64 or partials.ndim != 1 or partials.numel() < 1:
            raise ScoringRejected("loss_partials must be a non-empty float64 vector")
        if partials.numel() > MAX_PARTIALS:
            raise ScoringRejected(f"more than {MAX_PARTIALS} loss partials")
        if not bool(torch.isfinite(partials).all()):
            raise ScoringRejected("the loss sum is not finite")
        for name, t in (("correct", correct), ("count", count)):
            if t.dtype != torch.int64 or t.shape != (1,):
                raise ScoringRejected(f"{name} must be one int64")
        c, n = int(correct[0]), int(count[0])
        if expected_count is not None and n != expected_count:
            raise ScoringRejected(f"it scored {n} samples; the task has {expected_count}")
        if not 0 <= c <= n:
            raise ScoringRejected(f"{c} correct of {n} samples")
        return cls(exact_partials(partials.tolist()), c, n)


def combine(sums: Sequence[ScoreSums]) -> ScoreSums:
    """Every task's sums as one, exactly: the partials merged, the counts added."""
    partials: list[float] = []
    for s in sums:
        for p in s.partials:
            _msum_add(partials, p)
    return ScoreSums(tuple(partials), sum(s.correct for s in sums), sum(s.count for s in sums))


def in_row_order(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row of the dataset, both splits, in the source file's order where the loader
    recorded it (tabular files and digits), else the training rows then the test rows."""
    if dataset.rows_train is None or dataset.rows_test is None:
        return (torch.cat([dataset.x_train, dataset.x_test]),
                torch.cat([dataset.y_train, dataset.y_test]))  # fmt: skip
    n = dataset.num_train + dataset.num_test
    x = torch.empty((n, *dataset.x_train.shape[1:]), dtype=dataset.x_train.dtype)
    y = torch.empty((n, *dataset.y_train.shape[1:]), dtype=dataset.y_train.dtype)
    x[dataset.rows_train], x[dataset.rows_test] = dataset.x_train, dataset.x_test
    y[dataset.rows_train], y[dataset.rows_test] = dataset.y_train, dataset.y_test
    return x, y


def task_ranges(rows: int, tasks: int) -> list[tuple[int, int]]:
    """[start, stop) row ranges of about equal size, each starting at a multiple of
    SCORE_BATCH: at most `tasks`, fewer when the rows make fewer whole batches."""
    batches = max(1, math.ceil(rows / SCORE_BATCH))
    count = max(1, min(tasks, batches))
    per, extra = divmod(batches, count)
    ranges, start = [], 0
    for i in range(count):
        stop = min(rows, start + (per + (i < extra)) * SCORE_BATCH)
        ranges.append((start, stop))
        start = stop
    return ranges


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def score(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> ScoreSums:
    """Score rows x (labels y) in batches of SCORE_BATCH: every sample's loss summed exactly,
    the correct predictions and the samples counted (a language model's tokens, padding left
    out)."""
    device = _device_of(model)
    was_training = model.training
    model.eval()
    partials: list[float] = []
    correct = count = 0
    for start in range(0, int(x.shape[0]), SCORE_BATCH):
        xb = x[start : start + SCORE_BATCH].to(device)
        yb = y[start : start + SCORE_BATCH].to(device)
        logits = model(xb).float()
        if task == "language_model":
            logits, yb = logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)
        mask = yb != IGNORE_INDEX
        losses = F.cross_entropy(logits, yb, ignore_index=IGNORE_INDEX, reduction="none")
        for v in losses[mask].double().cpu().tolist():
            _msum_add(partials, v)
        correct += int((logits.argmax(-1)[mask] == yb[mask]).sum())
        count += int(mask.sum())
    model.train(was_training)
    return ScoreSums(tuple(partials), correct, count)


def evaluate_rows(model: nn.Module, dataset: Dataset) -> ScoreSums:
    """A single process's evaluation of every row: what a distributed evaluation must equal."""
    x, y = in_row_order(dataset)
    return score(model, x, y, dataset.task)


@dataclass(frozen=True)
class Predictions:
    """One inference task's output: each row's predicted class and class probabilities."""

    labels: torch.Tensor  # int64 [rows]
    probs: torch.Tensor  # float32 [rows, classes]

    def to_bytes(self, metadata: dict[str, str] | None = None) -> bytes:
        tensors = {"labels": self.labels, "probs": self.probs}
        return encode_state(tensors, {"kind": "inference", **(metadata or {})})

    @classmethod
    def from_bytes(cls, data: bytes, rows: int, num_classes: int) -> Predictions:
        tensors = _decoded(data, "inference", {"labels", "probs"})
        labels, probs = tensors["labels"], tensors["probs"]
        if labels.dtype != torch.int64 or labels.shape != (rows,):
            raise ScoringRejected(f"labels must be int64 of shape [{rows}]")
        if probs.dtype != torch.float32 or probs.shape != (rows, num_classes):
            raise ScoringRejected(f"probs must be float32 of shape [{rows}, {num_classes}]")
        if rows and not bool(((labels >= 0) & (labels < num_classes)).all()):
            raise ScoringRejected(f"a label outside 0..{num_classes - 1}")
        if not bool(torch.isfinite(probs).all()) or bool(((probs < 0) | (probs > 1)).any()):
            raise ScoringRejected("probabilities must lie in [0, 1]")
        return cls(labels, probs)


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> Predictions:
    """Class predictions and probabilities for rows x, in batches of SCORE_BATCH."""
    device = _device_of(model)
    was_training = model.training
    model.eval()
    labels, probs = [], []
    for start in range(0, int(x.shape[0]), SCORE_BATCH):
        p = torch.softmax(model(x[start : start + SCORE_BATCH].to(device)).float(), dim=-1)
        probs.append(p.cpu())
        labels.append(p.argmax(-1).cpu())
    model.train(was_training)
    if not probs:
        return Predictions(torch.zeros(0, dtype=torch.int64), torch.zeros(0, 0))
    return Predictions(torch.cat(labels).to(torch.int64), torch.cat(probs).contiguous())


# Replicas of a scoring task may run on different devices (a CPU, a GPU): their sums and
# probabilities differ in the last bits, and a near tie can flip one argmax. They agree when
# at most this share of the rows (and at least one row) differ in class, and the losses and
# probabilities lie within these tolerances; a node that made its result up differs in far
# more than that.
FLIP_FRACTION = 0.002
LOSS_RTOL = 1e-3
PROB_ATOL = 1e-3


def _flips_allowed(rows: int) -> int:
    return max(1, math.floor(FLIP_FRACTION * rows))


def sums_agree(a: ScoreSums, b: ScoreSums) -> bool:
    if a.count != b.count or abs(a.correct - b.correct) > _flips_allowed(a.count):
        return False
    la, lb = a.loss_sum / max(a.count, 1), b.loss_sum / max(b.count, 1)
    return abs(la - lb) <= LOSS_RTOL * max(1.0, abs(la), abs(lb))


def predictions_agree(a: Predictions, b: Predictions) -> bool:
    if a.labels.shape != b.labels.shape or a.probs.shape != b.probs.shape:
        return False
    flips = int((a.labels != b.labels).sum())
    if flips > _flips_allowed(int(a.labels.numel())):
        return False
    return not a.probs.numel() or float((a.probs - b.probs).abs().max()) <= PROB_ATOL


def _decoded(data: bytes, kind: str, keys: set[str]) -> dict[str, torch.Tensor]:
    try:
        tensors, meta = decode_state(data)
    except UpdateRejected as exc:
        raise ScoringRejected(f"not a readable result: {exc}") from None
    if meta.get("kind") != kind:
        raise ScoringRejected(f"not an {kind} result (its kind is {meta.get('kind')!r})")
    if set(tensors) != keys:
        raise ScoringRejected(f"it must hold exactly {', '.join(sorted(keys))}")
    return tensors
