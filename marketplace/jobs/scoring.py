"""Submitting scoring jobs (`kind: evaluate` and `kind: inference`): one pass of a finished
model over a dataset, cut into tasks of contiguous rows (trainer.scoring).

The model is a finished training job's (`source.job`, the buyer's own: its final model and its
spec's model section) or an uploaded safetensors checkpoint with the spec's model section.
Every row of the dataset is scored, in the file's order; the tasks start at multiples of
trainer.scoring.SCORE_BATCH so that the distributed result equals one process's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from django.conf import settings

from marketplace.accounts.models import User
from marketplace.jobs import files
from marketplace.jobs.errors import InvalidDataset, InvalidSpec
from marketplace.jobs.models import Job, JobStatus
from trainer.datasets import Dataset
from trainer.scoring import in_row_order, task_ranges
from trainer.sharding import Shard as PlannedShard
from trainer.sharding import shard_hash
from trainer.spec import JobSpec

# the file a source job's final model is written to in the request's temporary folder,
# where an uploaded checkpoint would be
SOURCE_WEIGHTS = "source-weights.safetensors"


def _invalid(field: str, reason: str) -> InvalidSpec:
    return InvalidSpec(
        f"The job spec is invalid: {field}: {reason}.",
        problems=[{"field": field, "reason": reason}],
    )


@dataclass(frozen=True)
class Source:
    spec: JobSpec  # with the source job's model section
    weights: Path  # its final model, in the request's temporary folder
    job: Job


def resolve_source(buyer: User, spec: JobSpec, tmp: Path) -> Source | None:
    """A scoring spec's `source.job`: the buyer's own finished training job with a model.
    None when the spec brings its own checkpoint instead."""
    if spec.source is None:
        return None
    job = Job.objects.filter(pk=spec.source.job, buyer=buyer).first()
    if job is None:
        raise _invalid("source.job", "you have no job with this id")
    if job.parsed_spec.kind != "train":
        raise _invalid("source.job", f"it is a {job.parsed_spec.kind} job; name a training job")
    if job.status not in (JobStatus.COMPLETED, JobStatus.STOPPED) or not job.model_file:
        raise _invalid("source.job", f"the job is {job.status} and has no final model yet")
    path = tmp / SOURCE_WEIGHTS
    path.write_bytes(files.get(job.model_file))
    # the source's own initial-weights name means nothing here: its final model is the model
    model = job.parsed_spec.model.model_copy(update={"checkpoint": None})
    return Source(spec.replace(model=model), path, job)


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
