"""The sharding planner: which training samples each node trains on.

A shard is identified by the content of its samples (not their indices), so a node can prove
it holds the data it was given and two plans that pick the same samples agree on the hash.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trainer.datasets.base import Dataset
from trainer.hashing import state_hash

METHODS = ("random", "stratified", "capability", "length", "prepartitioned")


class ShardingError(ValueError):
    """A sharding request that cannot be satisfied; the message says why."""


@dataclass(frozen=True)
class Shard:
    index: int
    indices: np.ndarray  # int64, sorted; rows of dataset.x_train
    content_hash: str  # sha256 over the x and y rows at `indices`

    @property
    def size(self) -> int:
        return int(self.indices.size)

    # Written out because the generated versions would compare / hash an ndarray.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shard):
            return NotImplemented
        return (
            self.index == other.index
            and self.content_hash == other.content_hash
            and np.array_equal(self.indices, other.indices)
        )

    def __hash__(self) -> int:
        return hash((self.index, self.content_hash))


def shard_hash(dataset: Dataset, indices: np.ndarray) -> str:
    """sha256 of the samples themselves, so the hash survives re-indexing of the dataset."""
    idx = torch.from_numpy(np.array(indices, dtype=np.int64))  # a copy: input may be read-only
    return state_hash({"x": dataset.x_train[idx], "y": dataset.y_train[idx]})


def plan_shards(
    dataset: Dataset,
    num_shards: int,
    method: str = "stratified",
    seed: int = 0,
    weights: Sequence[float] | None = None,
    partitions: Sequence[Sequence[int]] | None = None,
) -> list[Shard]:
    """Split dataset's training rows into `num_shards` shards; deterministic for `seed`.

    random: a seeded permutation cut into near-equal parts.
    stratified: every shard within +-1 sample of its exact share of every class (falls back
        to random for non-classification tasks, which have no classes).
    capability: sizes proportional to `weights` (node throughputs), class mix kept.
    length: sequence data; every shard gets a similar mix of lengths and total tokens.
    prepartitioned: `partitions` are each node's own rows (federated silos), used as given.
    `weights` and `partitions` are ignored by the methods that do not use them.
    """
    n = dataset.num_train
    num_shards = _check_count(num_shards, n)
    rng = np.random.default_rng(seed)
    if method == "random":
        parts = _random(n, num_shards, rng)
    elif method == "stratified":
        parts = _stratified(dataset, num_shards, rng)
    elif method == "capability":
        parts = _capability(dataset, num_shards, weights, rng)
    elif method == "length":
        parts = _length(dataset, num_shards, rng)
    elif method == "prepartitioned":
        parts = _prepartitioned(n, num_shards, partitions)
    else:
        raise ShardingError(f"unknown sharding method {method!r}; known: {', '.join(METHODS)}")
    return [_make_shard(dataset, i, part) for i, part in enumerate(parts)]


def _make_shard(dataset: Dataset, index: int, part: np.ndarray) -> Shard:
    indices = np.sort(np.asarray(part, dtype=np.int64))
    return Shard(index=index, indices=indices, content_hash=shard_hash(dataset, indices))


def _check_count(num_shards: int, n: int) -> int:
    try:
        count = operator.index(num_shards)
    except TypeError:
        raise ShardingError(f"num_shards must be an integer, got {num_shards!r}") from None
    if count < 1:
        raise ShardingError(f"num_shards must be >= 1, got {count}")
    if count > n:
        raise ShardingError(
            f"{count} shards but only {n} training samples: every shard needs at least one"
        )
    return count


# -- random / stratified ---------------------------------------------------------------------


def _random(n: int, num_shards: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), num_shards)


def _class_labels(dataset: Dataset) -> np.ndarray | None:
    """Per-sample class ids, or None when the task has no classes."""
    if dataset.task != "classification" or dataset.y_train.ndim != 1:
        return None
    return dataset.y_train.cpu().numpy().astype(np.int64)


def _grouped_by_class(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """All indices sorted by class, shuffled within each class (O(N log N) for any K)."""
    perm = rng.permutation(labels.size)
    return perm[np.argsort(labels[perm], kind="stable")]


def _stratified(dataset: Dataset, num_shards: int, rng: np.random.Generator) -> list[np.ndarray]:
    labels = _class_labels(dataset)
    if labels is None:
        return _random(dataset.num_train, num_shards, rng)
    # Dealing every class round-robin, each class starting where the previous one stopped,
    # is one round-robin over the class-sorted sequence: each shard gets floor or ceil of
    # every class's share, and the shard totals also differ by at most one.
    order = _grouped_by_class(labels, rng)
    return [order[s::num_shards] for s in range(num_shards)]


# -- capability ------------------------------------------------------------------------------


def _capability(
    dataset: Dataset,
    num_shards: int,
    weights: Sequence[float] | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    sizes = capability_sizes(dataset.num_train, _check_weights(weights, num_shards))
    labels = _class_labels(dataset)
    order = _interleaved(labels, rng) if labels is not None else rng.permutation(dataset.num_train)
    # Contiguous runs of an interleaved order carry each class in proportion to their length.
    return np.split(order, np.cumsum(sizes)[:-1])


def _check_weights(weights: Sequence[float] | None, num_shards: int) -> np.ndarray:
    if weights is None:
        raise ShardingError("method 'capability' needs weights (one throughput per shard)")
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ShardingError(f"weights must be numbers, got {weights!r}") from None
    if w.ndim != 1 or w.size != num_shards:
        raise ShardingError(f"{w.size} weights for {num_shards} shards: give one per shard")
    bad = np.flatnonzero(~np.isfinite(w) | (w <= 0))
    if bad.size:
        raise ShardingError(f"weights must be positive and finite; weight {bad[0]} is {w[bad[0]]}")
    return w


def capability_sizes(n: int, weights: np.ndarray) -> np.ndarray:
    """Shard sizes proportional to `weights` summing to exactly n (largest remainder), each
    at least 1: a very slow node still gets one sample rather than silently none."""
    quotas = n * weights / weights.sum()
    sizes = np.floor(quotas).astype(np.int64)
    remainders = quotas - sizes
    # Stable sort on -remainder: ties go to the lower shard index, deterministically.
    for i in np.argsort(-remainders, kind="stable")[: n - int(sizes.sum())]:
        sizes[i] += 1
    for i in np.flatnonzero(sizes == 0):
        sizes[int(np.argmax(sizes))] -= 1
        sizes[i] = 1
    return sizes


def _interleaved(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """All samples in an order where every class is spread evenly along the sequence.

    The j-th (shuffled) sample of a class of size n_c sits at position (j + 0.5) / n_c; sorting
    by position interleaves classes so any contiguous run holds each in proportion.
    """
    order = _grouped_by_class(labels, rng)
    grouped = labels[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    sizes = np.diff(np.r_[starts, grouped.size])
    rank = np.arange(grouped.size) - np.repeat(starts, sizes)
    positions = (rank + 0.5) / np.repeat(sizes, sizes)
    return order[np.argsort(positions, kind="stable")]


# -- length ----------------------------------------------------------------------------------


def _length(dataset: Dataset, num_shards: int, rng: np.random.Generator) -> list[np.ndarray]:
    if dataset.lengths_train is None:
        raise ShardingError(
            f"method 'length' needs per-sample lengths; dataset {dataset.name!r} has none "
            "(it is not sequence data)"
        )
    lengths = dataset.lengths_train.cpu().numpy().astype(np.int64)
    # Shuffle then stable-sort: equal lengths end up in a seeded order.
    shuffled = rng.permutation(lengths.size)
    by_length = shuffled[np.argsort(-lengths[shuffled], kind="stable")]
    # Dealt longest first, each sample to the shard with the fewest tokens so far (then the
    # fewest samples). Consecutive samples of similar length thus go round the shards like
    # buckets dealt one per shard, so every shard gets the same mix of lengths; unlike a strict
    # one-per-shard deal, a shard that drew a shorter sample in a mixed bucket makes up for it
    # with an extra short one later, so token totals end within about one short sample.
    heap = [(0, 0, shard) for shard in range(num_shards)]
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for sample in by_length.tolist():
        tokens, count, shard = heapq.heappop(heap)
        shards[shard].append(sample)
        heapq.heappush(heap, (tokens + int(lengths[sample]), count + 1, shard))
    return [np.asarray(s, dtype=np.int64) for s in shards]


# -- prepartitioned --------------------------------------------------------------------------


def _prepartitioned(
    n: int, num_shards: int, partitions: Sequence[Sequence[int]] | None
) -> list[np.ndarray]:
    if partitions is None:
        raise ShardingError("method 'prepartitioned' needs partitions (one index list per node)")
    if len(partitions) != num_shards:
        raise ShardingError(f"{len(partitions)} partitions for {num_shards} shards")
    owner = np.full(n, -1, dtype=np.int64)
    parts = []
    for p, part in enumerate(partitions):
        idx = _partition_indices(p, part, n)
        seen_here = np.unique(idx, return_counts=True)
        if (seen_here[1] > 1).any():
            dup = int(seen_here[0][seen_here[1] > 1][0])
            raise ShardingError(f"partition {p} lists index {dup} more than once")
        taken = owner[idx] >= 0
        if taken.any():
            dup = int(idx[taken][0])
            raise ShardingError(
                f"index {dup} is in partition {owner[dup]} and partition {p}; "
                "partitions must be disjoint"
            )
        owner[idx] = p
        parts.append(idx)
    return parts


def _partition_indices(p: int, part: Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(part)
    if idx.size == 0:
        raise ShardingError(f"partition {p} is empty; every node needs at least one sample")
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise ShardingError(f"partition {p} must be a flat list of integer indices")
    idx = idx.astype(np.int64)
    out = (idx < 0) | (idx >= n)
    if out.any():
        raise ShardingError(f"partition {p} has index {int(idx[out][0])} out of range (0..{n - 1})")
    return idx
