"""Aggregation of federated updates: pure rules (`functions`) and server strategies."""

from __future__ import annotations

from trainer.aggregation.functions import (
    coordinate_median,
    flatten_state,
    krum_min_updates,
    krum_scores,
    mean,
    multi_krum,
    pairwise_sq_distances,
    trimmed_mean,
    unflatten_state,
    weighted_mean,
)
from trainer.aggregation.strategies import (
    ClientUpdate,
    DiLoCo,
    FedAdam,
    FedAvg,
    FedProx,
    Median,
    MultiKrum,
    Strategy,
    TrimmedMean,
    build_strategy,
    min_updates,
    round_size_problems,
)
from trainer.aggregation.weighting import health_weighted

__all__ = [
    "ClientUpdate",
    "DiLoCo",
    "FedAdam",
    "FedAvg",
    "FedProx",
    "Median",
    "MultiKrum",
    "Strategy",
    "TrimmedMean",
    "build_strategy",
    "coordinate_median",
    "flatten_state",
    "health_weighted",
    "krum_min_updates",
    "krum_scores",
    "mean",
    "min_updates",
    "multi_krum",
    "pairwise_sq_distances",
    "round_size_problems",
    "trimmed_mean",
    "unflatten_state",
    "weighted_mean",
]
