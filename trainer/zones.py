"""Regional (zone) pre-aggregation: the math, the wire format and the member tokens.

A job with `aggregation.hierarchy: zones` lets a platform node act as its zone's
aggregator: the zone's members upload to it, it checks each update as the coordinator
would (`trainer.compression.decode_any`, the spec's norm bound) and sends the coordinator
ONE payload per flush: the samples-weighted partial sum S = sum_i n_i * d_i of its members'
deltas, and a manifest naming every member (task, node, update hash, samples, metrics).

FedAvg stays exact: the coordinator turns a partial into one update S / N with weight
N = sum_i n_i, and sum_z N_z * (S_z / N_z) / sum_z N_z = sum_i n_i d_i / sum_i n_i, the flat
weighted mean (up to float rounding: the sum travels in the model's dtype). The same holds
for every strategy whose first step is that weighted mean (FedProx, FedAdam, DiLoCo), and for
none whose rule looks at single updates (trimmed mean, median, Krum: ZONE_INCOMPATIBLE).

Members prove to the aggregator that the coordinator gave them the task with a token:
HMAC-SHA256 under a per-round, per-aggregator key the coordinator derives from its secret and
hands to the aggregator, over (task id, node id, samples). The aggregator checks it without
calling the coordinator, and a member cannot change its own weight. Nothing here imports
Django; the marketplace and the agent both use it. Never pickle: safetensors and JSON only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trainer.spec import ZONE_INCOMPATIBLE
from trainer.updates import UpdateRejected, decode_state, encode_state, validate_update
from trainer.zone_tokens import TOKEN_HEADER, member_token, round_key, token_ok

__all__ = [
    "TOKEN_HEADER", "ZONE_INCOMPATIBLE", "Member", "PartialSum", "decode_partial",
    "encode_partial", "member_token", "round_key", "token_ok",
]  # fmt: skip
PARTIAL_KIND = "zone-partial"
MAX_MEMBERS = 256  # one partial's manifest must fit the safetensors metadata (64 KiB)


# ------------------------------------------------------------------------------- math


@dataclass(frozen=True)
class Member:
    """One member update an aggregator combined (the manifest's entry)."""

    task_id: str
    node_id: str
    update_hash: str  # sha256 of the bytes the member uploaded (the coordinator's key too)
    samples: int
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "node_id": self.node_id,
            "update_hash": self.update_hash,
            "samples": self.samples,
            "metrics": dict(self.metrics),
        }


class PartialSum:
    """A running samples-weighted sum of deltas, float64 while it accumulates."""

    def __init__(self) -> None:
        self.acc: dict[str, Tensor] | None = None
        self.dtypes: dict[str, torch.dtype] = {}
        self.members: list[Member] = []

    @property
    def samples(self) -> int:
        return sum(m.samples for m in self.members)

    def add(self, delta: Mapping[str, Tensor], member: Member) -> None:
        if member.samples < 1:
            raise ValueError(f"member {member.node_id} has {member.samples} samples")
        if any(m.task_id == member.task_id for m in self.members):
            raise ValueError(f"task {member.task_id} is already in this partial sum")
        if self.acc is None:
            self.acc = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in delta.items()}
            self.dtypes = {k: v.dtype for k, v in delta.items()}
        elif set(delta) != set(self.acc):
            raise ValueError("a member's update has other tensors than the partial sum")
        for name, running in self.acc.items():
            running.add_(delta[name].detach().to(torch.float64), alpha=member.samples)
        self.members.append(member)

    def state(self) -> dict[str, Tensor]:
        """The sum, in the model's dtypes (what travels)."""
        if self.acc is None:
            raise ValueError("an empty partial sum")
        return {k: v.to(self.dtypes[k]) for k, v in self.acc.items()}


def encode_partial(partial: PartialSum, *, job_id: str, round_id: str, zone: str) -> bytes:
    """Safetensors bytes: the sum's tensors, and the manifest as JSON in the metadata."""
    if len(partial.members) > MAX_MEMBERS:
        raise ValueError(f"at most {MAX_MEMBERS} members per partial")
    manifest = {
        "kind": PARTIAL_KIND,
        "job_id": job_id,
        "round_id": round_id,
        "zone": zone,
        "samples": partial.samples,
        "members": [m.to_dict() for m in partial.members],
    }
    return encode_state(partial.state(), {"manifest": json.dumps(manifest, sort_keys=True)})


@dataclass(frozen=True)
class DecodedPartial:
    mean: dict[str, Tensor]  # S / N in the reference's dtypes: the zone's one update
    samples: int
    members: list[Member]
    zone: str
    round_id: str


def _member(raw: Any) -> Member:
    if not isinstance(raw, dict):
        raise UpdateRejected("metadata", "a manifest member is not an object")
    try:
        samples = raw["samples"]
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise UpdateRejected("metadata", "a member's samples must be a whole number >= 1")
        metrics = raw.get("metrics") or {}
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in metrics.values()
        ):
            raise UpdateRejected("metadata", "a member's metrics must be finite numbers")
        return Member(
            str(raw["task_id"]), str(raw["node_id"]), str(raw["update_hash"]), samples,
            {str(k): float(v) for k, v in metrics.items()},
        )  # fmt: skip
    except KeyError as exc:
        raise UpdateRejected("metadata", f"a manifest member lacks {exc.args[0]!r}") from None


def decode_partial(
    data: bytes, reference: Mapping[str, Tensor], max_norm: float | None
) -> DecodedPartial:
    """Parse and check a partial: the manifest, the sum's structure, finiteness, and the norm
    bound on S / N (a mean of updates within the bound is within it: the triangle
    inequality), so a partial passes exactly when its members' weighted mean would."""
    tensors, meta = decode_state(data)
    try:
        manifest = json.loads(meta.get("manifest", ""))
    except json.JSONDecodeError:
        raise UpdateRejected("metadata", "the partial's manifest is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != PARTIAL_KIND:
        raise UpdateRejected("metadata", f"the payload is not a {PARTIAL_KIND}")
    raw_members = manifest.get("members")
    if not isinstance(raw_members, list) or not 1 <= len(raw_members) <= MAX_MEMBERS:
        raise UpdateRejected("metadata", f"a partial names 1 to {MAX_MEMBERS} members")
    members = [_member(m) for m in raw_members]
    if len({m.task_id for m in members}) != len(members):
        raise UpdateRejected("metadata", "a task appears twice in the manifest")
    samples = sum(m.samples for m in members)
    if manifest.get("samples") != samples:
        raise UpdateRejected("metadata", "the manifest's samples are not its members' sum")
    for name, tensor in tensors.items():
        ref = reference.get(name)
        if ref is not None and tensor.dtype != ref.dtype:
            raise UpdateRejected("dtype", f"tensor '{name}' has dtype {tensor.dtype}", name)
    mean = {k: (v.to(torch.float64) / samples).to(v.dtype) for k, v in tensors.items()}
    validate_update(mean, reference, max_norm)
    return DecodedPartial(
        mean, samples, members, str(manifest.get("zone", "")), str(manifest.get("round_id", ""))
    )


def combine(partials: Iterable[tuple[Mapping[str, Tensor], int]]) -> dict[str, Tensor]:
    """The coordinator's weighted mean of zone means (a test of exactness; the marketplace
    feeds the zone means to its strategy, which computes the same)."""
    acc: dict[str, Tensor] = {}
    total = 0
    for mean, samples in partials:
        for k, v in mean.items():
            acc.setdefault(k, torch.zeros_like(v, dtype=torch.float64)).add_(
                v.to(torch.float64), alpha=samples
            )
        total += samples
    return {k: (v / total).to(torch.float32) for k, v in acc.items()}
