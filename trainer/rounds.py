"""Closing a round: the one way the in-process simulator, the network-aware simulator and the
marketplace's aggregation worker all do it.

The updates come in validated: each was decoded and checked against the global model when it
arrived (trainer.updates), and the coordinator has already weighted or dropped late ones.
Closing then, in this order:
1. the statistical filter drops updates pointing away from the round's coordinate-wise
   median (a robust reference: one huge malicious update cannot drag it, a mean would);
2. the strategy aggregates the rest;
3. with a delivery codec, the model adopts the step as nodes will decode it from the round's
   delta payload (trainer.delivery), the encoding error carried to the next round;
4. the new model is evaluated on the held-out split;
5. the round's provenance record is appended (its artifacts to the store, when one is given).
`checkpoint_after` then gives what a coordinator saves to resume from. Pure PyTorch: no
framework and no I/O beyond the artifact store the caller passes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.aggregation import ClientUpdate, Strategy
from trainer.aggregation.functions import coordinate_median, flatten_state
from trainer.artifacts import ArtifactStore
from trainer.checkpoint import Checkpoint
from trainer.compression import CodecConfig
from trainer.datasets import Dataset
from trainer.delivery import deliver_step
from trainer.evaluate import Evaluation, evaluate
from trainer.provenance import ProvenanceChain, RoundRecord, record_round
from trainer.spec import TargetSpec

State = dict[str, torch.Tensor]

# Cosine to the round's median update below which an update is dropped: honest updates on
# non-IID shards still agree with the median's direction (cosine > 0 in practice), a
# sign-flipped or random one does not. The marketplace's GPUFLEX_MIN_COSINE overrides it.
DEFAULT_MIN_COSINE = -0.25
# with fewer updates the median is one of them, or their mean: no reference to judge by
FILTER_MIN_UPDATES = 3


def staleness_weight(staleness: int) -> float:
    """The weight of an update trained on a model `staleness` rounds old, folded into the
    current round (FedBuff's polynomial discount: 1/sqrt(1 + s))."""
    return 1 / math.sqrt(1 + staleness)


@dataclass
class ClosedRound:
    state: State  # the new global model
    evaluation: Evaluation
    reached_target: bool
    kept: list[int]  # indices into the round's updates that were aggregated, in order
    dropped: dict[int, float]  # index -> cosine, for updates the filter dropped
    cosines: dict[int, float]  # index -> cosine to the median, for every update judged
    record: RoundRecord
    # with a delivery codec: the delta from the round's input model to `state` that nodes
    # download, and what it left out (the next round's `residual`); None when nothing moved
    delta: bytes | None = None
    residual: State | None = None

    @property
    def metrics(self) -> dict[str, float]:
        return {"accuracy": self.evaluation.accuracy, "loss": self.evaluation.loss}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = float(a.norm()) * float(b.norm())
    return float(a @ b) / denom if denom > 0 else 0.0


def statistical_filter(
    deltas: Sequence[Mapping[str, torch.Tensor]], min_cosine: float | None = DEFAULT_MIN_COSINE
) -> tuple[list[int], dict[int, float], dict[int, float]]:
    """(kept indices, dropped index -> cosine, every index -> cosine); `min_cosine` None
    keeps everything (experiments on the strategies alone)."""
    if min_cosine is None or len(deltas) < FILTER_MIN_UPDATES:
        return list(range(len(deltas))), {}, {}
    reference = flatten_state(coordinate_median(list(deltas), dtype=torch.float64))
    cosines = {
        i: _cosine(flatten_state(d, dtype=torch.float64), reference) for i, d in enumerate(deltas)
    }
    kept = [i for i, c in cosines.items() if c >= min_cosine]
    return kept, {i: c for i, c in cosines.items() if c < min_cosine}, cosines


def close_round(
    *,
    number: int,
    global_state: Mapping[str, torch.Tensor],
    updates: Sequence[tuple[ClientUpdate, str]],
    strategy: Strategy,
    model: nn.Module,
    dataset: Dataset,
    chain: ProvenanceChain,
    store: ArtifactStore | None = None,
    target: TargetSpec | None = None,
    min_cosine: float | None = DEFAULT_MIN_COSINE,
    delivery: CodecConfig | None = None,
    residual: Mapping[str, torch.Tensor] | None = None,
) -> ClosedRound:
    """Filter, aggregate, evaluate and record round `number`. `updates` are (update, shard
    label) pairs in the order provenance replays them; `model` is loaded with the result.
    `delivery` (the job's download codec) and `residual` (the last round's `residual`) make
    the new model the canonical one nodes rebuild from `delta`."""
    kept, dropped, cosines = statistical_filter([u.delta for u, _ in updates], min_cosine)
    used = [updates[i] for i in kept]
    before = {k: v.clone() for k, v in strategy.state_dict().items()}
    new_state = (
        strategy.aggregate(global_state, [u for u, _ in used]) if used else dict(global_state)
    )
    delta, left, delivered = None, residual, None
    if delivery is not None and used:  # a round without updates leaves the model as it was
        step = deliver_step(global_state, new_state, delivery, residual)
        new_state, delta, left = step.state, step.payload, step.residual
        delivered = {"codec": delivery.name, "block_size": delivery.block_size,
                     "residual": residual}  # fmt: skip
    model.load_state_dict(new_state)
    ev = evaluate(model, dataset)
    record = record_round(
        chain,
        store,
        round=number,
        global_state=global_state,
        strategy=strategy,
        strategy_state_before=before,
        updates=used,
        new_state=new_state,
        metrics={"accuracy": ev.accuracy, "loss": ev.loss},
        delivery=delivered,
    )
    reached = bool(target and ev.meets(target.metric, target.value))
    return ClosedRound(new_state, ev, reached, kept, dropped, cosines, record, delta,
                       dict(left) if left is not None else None)  # fmt: skip


def checkpoint_after(
    closed: ClosedRound,
    *,
    number: int,
    spec: dict[str, Any],
    strategy: Strategy,
    chain: ProvenanceChain,
    history: list[dict[str, Any]],
    seed: int,
    **extra: Any,
) -> Checkpoint:
    """What a coordinator saves after round `number` to resume from it, or to prove it."""
    return Checkpoint(
        spec=spec,
        round=number,
        model_state=closed.state,
        strategy_state=strategy.state_dict(),
        history=history,
        rng={"seed": seed},
        extra={"provenance": chain.to_json(), "reached_target": closed.reached_target, **extra},
        residual=dict(closed.residual or {}),
    )
