"""Cutting a job's training split into shards: once at submission (generation 0), and again
at round boundaries for elastic jobs when the nodes online to work on the job ask for a
different cut (docs/job-spec.md, "Elastic and capability-weighted shards").

A re-cut is a new generation of Shard rows; older generations stay, since earlier rounds'
tasks, their verification and the provenance chain name them. Shards are never reserved to
nodes: a round's tasks are created in shard order (largest first for capability cuts), and
the claim order (scheduling.CLAIM_ORDER, by shard id) hands them out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from django.db.models import Max

from marketplace.jobs import files
from marketplace.jobs.datasets import job_dataset
from marketplace.jobs.models import Job, Shard
from marketplace.nodes.models import Node
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.scheduling import nodes_that_may_work_on
from marketplace.rounds.sizing import figures
from trainer.datasets import Dataset
from trainer.sharding import Shard as PlannedShard
from trainer.sharding import capability_sizes, plan_shards
from trainer.spec import JobSpec
from trainer.updates import encode_state

log = logging.getLogger(__name__)

# One shard per cohort node up to this many: past it, more shards only add per-task overhead
# (and tasks a round must wait for) without giving any node less to wait on.
MAX_SHARDS = 256


def cut(
    spec: JobSpec, dataset: Dataset, count: int, weights: Sequence[float] | None = None
) -> list[PlannedShard]:
    """The job's training split in `count` shards, with the spec's method and seed: the one
    place shards are planned, at submission and at every re-cut. `weights` are a capability
    cut's per-shard throughputs; without them (nobody known yet) the shares are equal."""
    method = spec.sharding.method
    if method == "capability" and weights is None:
        weights = [1.0] * count
    return plan_shards(dataset, count, method=method, seed=spec.seed, weights=weights)


def write(
    job_id: object,
    generation: int,
    dataset: Dataset,
    plans: list[PlannedShard],
    written: list[str],
) -> list[Shard]:
    """Store each planned shard's rows (the file the agent downloads) and return its Shard
    row, not yet saved; every name written is appended to `written`, for the caller to
    remove should its transaction fail."""
    base = files.job_dir(job_id)
    rows = []
    for plan in plans:
        idx = torch.from_numpy(plan.indices)
        tensors = {"x": dataset.x_train[idx], "y": dataset.y_train[idx]}
        if dataset.lengths_train is not None:
            tensors["lengths"] = dataset.lengths_train[idx]
        name = f"{base}/shards/{generation}/{plan.index}.safetensors"
        written.append(files.put(name, encode_state(tensors)))
        rows.append(
            Shard(
                job_id=job_id,
                generation=generation,
                index=plan.index,
                file=name,
                content_hash=plan.content_hash,
                size=plan.size,
            )
        )
    return rows


def newest_shards(job: Job) -> list[Shard]:
    """The job's newest generation of shards, in index order."""
    newest = job.shards.aggregate(g=Max("generation"))["g"]
    return list(job.shards.filter(generation=newest).order_by("index"))


def round_shards(job: Job, number: int, fewest: int) -> list[Shard]:
    """The shards round `number` of `job` trains on: the newest generation, re-cut first when
    the job re-shards and the online cohort asks for other shard sizes than it has. Round 1
    trains on the submission's cut; a round with nobody online keeps the cut it has (there is
    no cohort to size for). `fewest` is the count the aggregation strategy needs per round
    (lifecycle.fewest_shards), below which no re-cut goes."""
    current = newest_shards(job)
    spec = job.parsed_spec
    if number == 1 or job.is_federated or not spec.sharding.reshards or not current:
        return current
    cohort = list(nodes_that_may_work_on(job) & online_nodes())
    if not cohort:
        return current
    num_train = sum(s.size for s in current)  # every generation covers the split once
    weights = shard_weights(spec, cohort, shard_count(len(cohort), fewest, num_train))
    # An equal cut (random, stratified) has the sizes of capability_sizes with equal
    # weights (n // count, or one more), so comparing sizes catches a changed count for
    # every method, and a changed mix of speeds for capability cuts.
    wanted = sorted(capability_sizes(num_train, np.asarray(weights)).tolist())
    if wanted == sorted(s.size for s in current):
        return current
    return _recut(job, current[0].generation + 1, weights)


def shard_count(cohort: int, fewest: int, num_train: int) -> int:
    """One shard per cohort node, bounded by MAX_SHARDS, never fewer than the strategy needs
    nor more than there are training samples (every shard needs one)."""
    return min(max(min(cohort, MAX_SHARDS), fewest, 1), num_train)


def shard_weights(spec: JobSpec, cohort: Sequence[Node], count: int) -> list[float]:
    """`count` per-shard weights, largest first: equal for an elastic equal cut; for a
    capability cut each node's one speed figure (sizing.figures: nodes.selectors.speed_of,
    what sizing and billing read too), the fastest `count` nodes' when the cohort is larger,
    and the cohort's mean for shards beyond it (kept for the strategy's minimum: no node of
    their own)."""
    if spec.sharding.method != "capability":
        return [1.0] * count
    speeds = sorted(figures(cohort).values(), reverse=True)
    mean = sum(speeds) / len(speeds)
    return sorted(speeds[:count] + [mean] * (count - len(speeds)), reverse=True)


def _recut(job: Job, generation: int, weights: list[float]) -> list[Shard]:
    """Cut the job's training split (re-loaded: same seed, same held-out split) anew as
    `generation`. The caller's transaction holds the job; should it roll back, the files
    stay, and the retry writes the same names over them."""
    spec = job.parsed_spec
    dataset = job_dataset(job)
    plans = cut(spec, dataset, len(weights), weights)
    written: list[str] = []
    try:
        Shard.objects.bulk_create(write(job.id, generation, dataset, plans, written))
    except BaseException:
        files.delete_tree(written)
        raise
    log.info("job %s: re-cut into %d shards (generation %d)", job.pk, len(plans), generation)
    return newest_shards(job)
