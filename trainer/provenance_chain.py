"""The provenance chain itself (trainer.provenance): one record per aggregation round, linked
by hashes, and `verify_chain`, which checks it on its own. Pure Python: the web process shows
and checks a job's chain without torch (issue 36); appending a round (the aggregator) and
replaying it from artifacts (trainer.provenance) need torch."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.digest import short

if TYPE_CHECKING:
    from torch import Tensor

    from trainer.aggregation import Strategy

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


def float_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
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
        strategy_state_before: Mapping[str, Tensor] | None = None,
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
        from trainer.hashing import state_hash  # appending is the aggregator's (torch)

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
            metrics=float_metrics(metrics),
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
