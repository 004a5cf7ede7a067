"""Submitting scoring jobs (`kind: evaluate` and `kind: inference`): one pass of a finished
model over a dataset, cut into tasks of contiguous rows (trainer.scoring).

The model is a finished training job's (`source.job`, the buyer's own: its final model and its
spec's model section) or an uploaded safetensors checkpoint with the spec's model section.
Every row of the dataset is scored, in the file's order; the tasks start at multiples of
trainer.scoring.SCORE_BATCH so that the distributed result equals one process's.
"""

from __future__ import annotations

import numpy as np
import torch
from django.conf import settings

from marketplace.jobs.errors import InvalidDataset
from marketplace.jobs.scoring_source import SOURCE_WEIGHTS as SOURCE_WEIGHTS
from marketplace.jobs.scoring_source import Source as Source
from marketplace.jobs.scoring_source import _invalid
from marketplace.jobs.scoring_source import resolve_source as resolve_source
from trainer.datasets import Dataset
from trainer.scoring import in_row_order, task_ranges
from trainer.sharding import Shard as PlannedShard
from trainer.sharding import shard_hash
from trainer.spec import JobSpec


def check_data(spec: JobSpec, source: Source | None, dataset: Dataset) -> None:
    """Inference predicts classes; the dataset's rows must fit a source job's model (its
    input shape and classes)."""
    if spec.kind == "inference" and dataset.task != "classification":
        raise _invalid(
            "kind", "inference predicts classes; this dataset is not a classification one"
        )
    if source is None:
        return
    shape, classes = list(source.job.input_shape), source.job.num_classes
    if list(dataset.input_shape) != shape:
        raise InvalidDataset(
            f"The dataset's rows have shape {list(dataset.input_shape)}; the source job's "
            f"model takes {shape}."
        )
    if dataset.num_classes != classes:
        raise InvalidDataset(
            f"The dataset has {dataset.num_classes} classes; the source job's model has "
            f"{classes}. Labels are numbered in sorted order, so the dataset needs every class."
        )


def rows_dataset(dataset: Dataset) -> Dataset:
    """Every row, in the file's order, as the split the shards are cut from."""
    x, y = in_row_order(dataset)
    n = int(x.shape[0])
    return Dataset(
        name=dataset.name,
        task=dataset.task,
        x_train=x,
        y_train=y,
        x_test=x[:0],
        y_test=y[:0],
        num_classes=dataset.num_classes,
        input_shape=dataset.input_shape,
        rows_train=torch.arange(n),
        rows_test=torch.arange(0),
    )


def scoring_plans(spec: JobSpec, dataset: Dataset) -> list[PlannedShard]:
    """Contiguous row ranges, one task each: `sharding.num_shards` of them (the server's
    default without it), fewer when the rows make fewer whole batches."""
    count = spec.sharding.num_shards or settings.GPUFLEX["DEFAULT_SHARDS"]
    plans = []
    for index, (start, stop) in enumerate(task_ranges(dataset.num_train, count)):
        indices = np.arange(start, stop, dtype=np.int64)
        plans.append(PlannedShard(index, indices, shard_hash(dataset, indices)))
    return plans
