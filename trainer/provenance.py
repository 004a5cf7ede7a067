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

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.artifacts import ArtifactError, ArtifactStore, short
from trainer.hashing import state_hash

if TYPE_CHECKING:
    from trainer.aggregation import Strategy
    from trainer.spec import AggregationSpec

GENESIS = "0" * 64
FORMAT = "gpuflex/provenance-v1"


class ProvenanceError(ValueError):
    """A provenance document that cannot be parsed, or an append that would break the chain."""


@dataclass(frozen=True)
class Contribution:
    node_id: str
    shard_hash: str
    update_hash: str
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    # a zone aggregator's pre-aggregated update: which member contributions it combined
    # (task_id, node_id, update_hash, samples, metrics each). Absent from the hashed body
    # when empty, so records of flat rounds hash as they always did.
    members: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        body = {
            "node_id": self.node_id,
            "shard_hash": self.shard_hash,
            "update_hash": self.update_hash,
            "num_samples": self.num_samples,
            "metrics": dict(self.metrics),
        }
        if self.members:
            body["members"] = [dict(m) for m in self.members]
        return body

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contribution:
        return cls(
            node_id=str(data["node_id"]),
            shard_hash=str(data["shard_hash"]),
            update_hash=str(data["update_hash"]),
            num_samples=int(data["num_samples"]),
            metrics=dict(data.get("metrics", {})),
            members=tuple(dict(m) for m in data.get("members", ())),
        )


@dataclass(frozen=True)
class RoundRecord:
    job: str
    round: int
    input_model_hash: str
    strategy: str
    strategy_params: dict[str, Any]
    strategy_state_hash: str  # hash of strategy.state_dict() BEFORE this round
    contributions: tuple[Contribution, ...]
    output_model_hash: str
    metrics: dict[str, float]
    prev_hash: str  # record_hash of the previous record, GENESIS for the first
    record_hash: str  # sha256 of canonical JSON of every other field
    # delta-delivered rounds: {"codec", "block_size", "residual_hash" ("" for none)}; absent
    # from the hashed body otherwise, so records of other rounds hash as they always did
    delivery: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        """Every field except `record_hash`: what the record hash covers."""
        body = {
            "job": self.job,
            "round": self.round,
            "input_model_hash": self.input_model_hash,
            "strategy": self.strategy,
            "strategy_params": dict(self.strategy_params),
            "strategy_state_hash": self.strategy_state_hash,
            "contributions": [c.to_dict() for c in self.contributions],
            "output_model_hash": self.output_model_hash,
            "metrics": dict(self.metrics),
            "prev_hash": self.prev_hash,
        }
        if self.delivery is not None:
            body["delivery"] = dict(self.delivery)
        return body

    def compute_hash(self) -> str:
        return _canonical_hash(self.body())

    def to_dict(self) -> dict[str, Any]:
        return self.body() | {"record_hash": self.record_hash}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        return cls(
            job=str(data["job"]),
            round=int(data["round"]),
            input_model_hash=str(data["input_model_hash"]),
            strategy=str(data["strategy"]),
            strategy_params=dict(data["strategy_params"]),
            strategy_state_hash=str(data["strategy_state_hash"]),
            contributions=tuple(Contribution.from_dict(c) for c in data["contributions"]),
            output_model_hash=str(data["output_model_hash"]),
            metrics=dict(data["metrics"]),
            prev_hash=str(data["prev_hash"]),
            record_hash=str(data["record_hash"]),
            delivery=dict(data["delivery"]) if data.get("delivery") is not None else None,
        )


def _canonical_hash(body: Mapping[str, Any]) -> str:
    # Python's float repr round-trips exactly, so to_json/from_json never changes a hash
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    # numpy/torch scalars are not JSON; coerce here so hashing never fails later
    return {str(k): float(v) for k, v in metrics.items()}


class ProvenanceChain:
    def __init__(self, job: str, records: list[RoundRecord] | None = None) -> None:
        self.job = job
        self._records: list[RoundRecord] = list(records or [])

    @property
    def records(self) -> tuple[RoundRecord, ...]:
        return tuple(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[RoundRecord]:
        return iter(self._records)

    @property
    def head(self) -> str:
        return self._records[-1].record_hash if self._records else GENESIS

    def append(
        self,
        *,
        round: int,
        input_model_hash: str,
        strategy: Strategy,
        contributions: Iterable[Contribution],
        output_model_hash: str,
        metrics: Mapping[str, float],
        strategy_state_before: Mapping[str, torch.Tensor] | None = None,
        delivery: Mapping[str, Any] | None = None,
    ) -> RoundRecord:
        """Add the record for one round, filling `prev_hash` and `record_hash`.

        The record must describe the strategy state *before* the round. Pass
        `strategy_state_before` (a snapshot of `strategy.state_dict()` taken before
        `aggregate`); without it, `strategy.state_dict()` is hashed now, which is only right
        when append is called before aggregating.

        Refuses a round that could never verify (wrong round number, or an input model that
        is not the previous output) so that mistakes surface where they are made.
        """
        if self._records:
            last = self._records[-1]
            if round != last.round + 1:
                raise ProvenanceError(f"round {round}: expected round {last.round + 1} next")
            if input_model_hash != last.output_model_hash:
                raise ProvenanceError(
                    f"round {round}: input model {short(input_model_hash)} is not the previous "
                    f"round's output {short(last.output_model_hash)}"
                )
        before = strategy.state_dict() if strategy_state_before is None else strategy_state_before
        record = _sealed(
            job=self.job,
            round=int(round),
            input_model_hash=input_model_hash,
            strategy=strategy.name,
            strategy_params=dict(strategy.params()),
            strategy_state_hash=state_hash(before),
            contributions=tuple(contributions),
            output_model_hash=output_model_hash,
            metrics=_float_metrics(metrics),
            prev_hash=self.head,
            delivery=dict(delivery) if delivery is not None else None,
        )
        self._records.append(record)
        return record

    def to_json(self) -> str:
        doc = {"format": FORMAT, "job": self.job, "records": [r.to_dict() for r in self]}
        return json.dumps(doc, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ProvenanceChain:
        """Parse a chain. Stored record hashes are kept as they are, never trusted:
        run `verify_chain` to check them."""
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise ProvenanceError(f"not a provenance chain (format {doc.get('format')!r})")
            records = [RoundRecord.from_dict(r) for r in doc["records"]]
            return cls(str(doc["job"]), records)
        except ProvenanceError:
            raise
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProvenanceError(
                f"malformed provenance JSON: {type(exc).__name__}: {exc}"
            ) from None


def _sealed(**fields: Any) -> RoundRecord:
    unsealed = RoundRecord(**fields, record_hash="")
    return RoundRecord(**fields, record_hash=unsealed.compute_hash())


# -- verification ------------------------------------------------------------------------


@dataclass
class VerificationReport:
    ok: bool
    problems: list[str]
    rounds_checked: int
    rounds_replayed: int

    def __str__(self) -> str:
        head = (
            f"{'OK' if self.ok else 'FAILED'}: {self.rounds_checked} rounds checked, "
            f"{self.rounds_replayed} replayed"
        )
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


def _link_problems(record: RoundRecord, prev: RoundRecord | None, job: str) -> list[str]:
    tag = f"round {record.round}"
    problems = []
    if record.job != job:
        problems.append(f"{tag}: belongs to job {record.job!r}, not {job!r}")
    recomputed = record.compute_hash()
    if recomputed != record.record_hash:
        problems.append(
            f"{tag}: record hash mismatch: recorded {short(record.record_hash)}, "
            f"recomputed {short(recomputed)} (record was altered)"
        )
    expected_prev = prev.record_hash if prev else GENESIS
    if record.prev_hash != expected_prev:
        what = "the previous record's hash" if prev else "the genesis hash"
        problems.append(
            f"{tag}: broken link: prev_hash {short(record.prev_hash)} is not "
            f"{what} {short(expected_prev)}"
        )
    if prev is not None:
        if record.round != prev.round + 1:
            problems.append(
                f"{tag}: follows round {prev.round} (rounds missing, duplicated or out of order)"
            )
        if record.input_model_hash != prev.output_model_hash:
            problems.append(
                f"{tag}: input model {short(record.input_model_hash)} is not round "
                f"{prev.round}'s output {short(prev.output_model_hash)}"
            )
    return problems


def verify_chain(chain: ProvenanceChain, expected_head: str | None = None) -> VerificationReport:
    """Check the chain on its own. A chain cut short at the end still links correctly; pass
    `expected_head` (a head published elsewhere, e.g. on-chain) to detect that too."""
    problems: list[str] = []
    prev: RoundRecord | None = None
    for record in chain:
        problems += _link_problems(record, prev, chain.job)
        prev = record
    if expected_head is not None and chain.head != expected_head:
        problems.append(
            f"chain head {short(chain.head)} is not the expected head {short(expected_head)} "
            f"(records missing at the end or chain replaced)"
        )
    return VerificationReport(not problems, problems, len(chain), 0)


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
            metrics=_float_metrics(update.metrics),
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
