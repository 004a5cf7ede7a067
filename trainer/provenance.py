"""Verifiable training history: a hash chain with one record per aggregation round.

Each `RoundRecord` names, by content hash, the model that went into a round, the strategy
(name, parameters, state before the round), every contribution (node, shard, update, sample
count) in the order they were aggregated, and the model that came out. Records are linked
by `prev_hash`, so editing, dropping or reordering any of them breaks the chain.

Two levels of checking:

* `verify_chain` needs only the chain: record hashes, links, round numbers, and that each
  round starts from the previous round's output.
* `verify_with_artifacts` additionally replays every round from the `ArtifactStore`: it
  reloads the input model, the strategy state and each update by hash and re-runs the
  aggregation, which must reproduce the recorded output hash bit for bit. That holds on
  the same machine because float32 aggregation is deterministic for a fixed order of
  updates; the record keeps that order and the replay uses it. A round whose model was
  delivered as a delta (trainer.delivery) records the codec and the residual it carried in,
  and the replay applies the same encoding to the aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.artifacts import ArtifactError, ArtifactStore
from trainer.digest import short
from trainer.hashing import state_hash
from trainer.provenance_chain import (  # noqa: F401 (the chain's names, re-exported)
    FORMAT,
    GENESIS,
    Contribution,
    ProvenanceChain,
    ProvenanceError,
    RoundRecord,
    VerificationReport,
    float_metrics,
    verify_chain,
)

if TYPE_CHECKING:
    from trainer.aggregation import Strategy
    from trainer.spec import AggregationSpec


def _load(
    store: ArtifactStore, key: str, what: str, tag: str, problems: list[str]
) -> dict[str, torch.Tensor] | None:
    try:
        return store.get_state(key)
    except ArtifactError as exc:
        problems.append(f"{tag}: {what} {short(key)} unavailable: {exc}")
        return None


def _replay_round(
    record: RoundRecord, store: ArtifactStore, spec: AggregationSpec
) -> tuple[list[str], bool]:
    """Re-run one round from stored artifacts. Returns (problems, whether it was re-run)."""
    tag = f"round {record.round}"
    problems: list[str] = []
    strategy = build_strategy(spec)
    if strategy.name != record.strategy:
        problems.append(
            f"{tag}: strategy mismatch: recorded {record.strategy!r}, spec builds {strategy.name!r}"
        )
        return problems, False
    params = dict(strategy.params())
    if params != record.strategy_params:
        problems.append(
            f"{tag}: strategy params mismatch: recorded {record.strategy_params}, "
            f"spec gives {params}"
        )
    model = _load(store, record.input_model_hash, "input model", tag, problems)
    state = _load(store, record.strategy_state_hash, "strategy state", tag, problems)
    updates = []
    for c in record.contributions:
        delta = _load(store, c.update_hash, f"update from {c.node_id}", tag, problems)
        if delta is not None:
            updates.append(ClientUpdate(c.node_id, delta, c.num_samples))
    if model is None or state is None or len(updates) != len(record.contributions):
        problems.append(f"{tag}: not replayed (artifacts missing or corrupt)")
        return problems, False
    if not updates:
        # Strategies refuse to aggregate nothing; a round where no update arrived carries
        # the model over unchanged (the simulator's convention), so that is what we check.
        if record.output_model_hash != record.input_model_hash:
            problems.append(
                f"{tag}: no contributions, yet output model {short(record.output_model_hash)} "
                f"differs from input {short(record.input_model_hash)}"
            )
        return problems, True
    try:
        strategy.load_state_dict(state)
        result = strategy.aggregate(model, updates)
        if record.delivery is not None:
            result = _delivered(record, result, model, store, tag, problems)
    except Exception as exc:  # a verifier reports; it does not crash on bad inputs
        problems.append(f"{tag}: aggregation failed on replay: {type(exc).__name__}: {exc}")
        return problems, False
    recomputed = state_hash(result)
    if recomputed != record.output_model_hash:
        problems.append(
            f"{tag}: output model hash mismatch: recorded {short(record.output_model_hash)}, "
            f"recomputed {short(recomputed)}"
        )
    return problems, True


def _delivered(
    record: RoundRecord,
    aggregate: dict[str, torch.Tensor],
    model: dict[str, torch.Tensor],
    store: ArtifactStore,
    tag: str,
    problems: list[str],
) -> dict[str, torch.Tensor]:
    """The canonical model a delta-delivered round adopted from its aggregate."""
    from trainer.compression import CodecConfig
    from trainer.delivery import deliver_step

    d = record.delivery or {}
    residual = None
    if d.get("residual_hash"):
        residual = _load(store, d["residual_hash"], "delivery residual", tag, problems)
    codec = CodecConfig(str(d["codec"]), int(d["block_size"]))
    return deliver_step(model, aggregate, codec, residual).state


def verify_with_artifacts(
    chain: ProvenanceChain,
    store: ArtifactStore,
    spec: AggregationSpec,
    expected_head: str | None = None,
) -> VerificationReport:
    """`verify_chain` plus a replay of every round from the store (see module docstring).

    Each round is replayed independently from its stored input, so one bad round does not
    hide problems in later ones. Missing or tampered artifacts are reported, never raised.
    """
    report = verify_chain(chain, expected_head)
    replayed = 0
    for record in chain:
        problems, ran = _replay_round(record, store, spec)
        report.problems += problems
        replayed += ran
    report.rounds_replayed = replayed
    report.ok = not report.problems
    return report


# -- recording -----------------------------------------------------------------------------


def record_round(
    chain: ProvenanceChain,
    store: ArtifactStore | None,
    *,
    round: int,
    global_state: Mapping[str, torch.Tensor],
    strategy: Strategy,
    strategy_state_before: Mapping[str, torch.Tensor],
    updates: list[tuple[ClientUpdate, str]],
    new_state: Mapping[str, torch.Tensor],
    metrics: Mapping[str, float],
    delivery: Mapping[str, Any] | None = None,
) -> RoundRecord:
    """Store a finished round's artifacts and append its record.

    The caller aggregates first, so the strategy has already moved on:
    `strategy_state_before` must be the snapshot of `strategy.state_dict()` taken *before*
    `strategy.aggregate(global_state, ...)` (clone it if the strategy updates tensors in
    place). `updates` are (update, shard_hash) pairs in exactly the order they were passed
    to `aggregate`: the replay uses this order, and float sums depend on it.
    Without a store only the hashes are recorded (the chain verifies, but cannot be replayed).
    """

    def keep(state: Mapping[str, torch.Tensor]) -> str:
        return store.put_state(state) if store is not None else state_hash(state)

    input_hash = keep(global_state)
    keep(strategy_state_before)  # append hashes the same snapshot
    contributions = [
        Contribution(
            node_id=update.node_id,
            shard_hash=shard_hash,
            update_hash=keep(update.delta),
            num_samples=int(update.num_samples),
            metrics=float_metrics(update.metrics),
            members=tuple(dict(m) for m in update.members),
        )
        for update, shard_hash in updates
    ]
    output_hash = keep(new_state)
    recorded = None
    if delivery is not None:  # {"codec", "block_size", "residual": the state carried in}
        residual = delivery.get("residual")
        recorded = {"codec": delivery["codec"], "block_size": delivery["block_size"],
                    "residual_hash": keep(residual) if residual else ""}  # fmt: skip
    return chain.append(
        round=round,
        input_model_hash=input_hash,
        strategy=strategy,
        contributions=contributions,
        output_model_hash=output_hash,
        metrics=metrics,
        strategy_state_before=strategy_state_before,
        delivery=recorded,
    )
