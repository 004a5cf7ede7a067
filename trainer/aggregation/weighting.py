"""Health weighting (spec `aggregation.weighting: health`): each update of a round weighs
num_samples x its node's health score instead of num_samples alone.

The weight is folded into the update's delta rather than into a new field, for the same
reason late updates carry their staleness weight there: provenance records each contribution
as (delta, num_samples) and replays the round by aggregating exactly those, so whatever
weighting the round used must live in what it records. With update i scaled by

    h_i * sum(n) / sum(n * h)

the sample-weighted mean that FedAvg, FedProx, FedAdam and DiLoCo take becomes
sum(n_i h_i d_i) / sum(n_i h_i): the health-weighted mean, and num_samples stays the truth.
The statistical filter runs after this (trainer.rounds) on the scaled deltas; when it drops an
update, the kept ones keep their relative weights n x h.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

from trainer.aggregation.strategies import ClientUpdate

Labelled = tuple[ClientUpdate, str]  # (update, shard label), as trainer.rounds takes them


def node_health(node_id: str, scores: Mapping[str, float]) -> float:
    """The node's score clamped to [0, 1]; a node nobody scored counts as fully healthy."""
    score = float(scores.get(node_id, 1.0))
    if not math.isfinite(score):
        raise ValueError(f"health score of node '{node_id}' is {score}, not a finite number")
    return min(1.0, max(0.0, score))


def health_weighted(
    updates: Sequence[Labelled], scores: Mapping[str, float]
) -> tuple[list[Labelled], Literal["health", "samples"]]:
    """The updates with each delta scaled so that sample weighting gives num_samples x health,
    and the weighting that came out: "samples" (updates unchanged) when every weight would be
    0, since no average can be taken over weights that sum to nothing. Each weighted update's
    metrics gain its `health`, so provenance shows what it was weighted by."""
    healths = [node_health(u.node_id, scores) for u, _ in updates]
    samples = sum(u.num_samples for u, _ in updates)
    weighted = sum(u.num_samples * h for (u, _), h in zip(updates, healths, strict=True))
    if weighted <= 0:
        return list(updates), "samples"
    norm = samples / weighted
    out = []
    for (update, label), h in zip(updates, healths, strict=True):
        factor = h * norm
        delta = {name: tensor * factor for name, tensor in update.delta.items()}
        metrics = {**update.metrics, "health": h}
        out.append((replace(update, delta=delta, metrics=metrics), label))
    return out, "health"
