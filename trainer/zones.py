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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.spec import ZONE_INCOMPATIBLE
from trainer.updates import UpdateRejected, decode_state, encode_state, validate_update
from trainer.zone_manifest import MAX_MEMBERS, PARTIAL_KIND, ManifestError, Member, parse_manifest
from trainer.zone_tokens import TOKEN_HEADER, member_token, round_key, token_ok

__all__ = [
    "TOKEN_HEADER", "ZONE_INCOMPATIBLE", "Member", "PartialSum", "decode_partial",
    "encode_partial", "member_token", "round_key", "token_ok",
]  # fmt: skip


# ------------------------------------------------------------------------------- math


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


def decode_partial(
    data: bytes, reference: Mapping[str, Tensor], max_norm: float | None
) -> DecodedPartial:
    """Parse and check a partial: the manifest, the sum's structure, finiteness, and the norm
    bound on S / N (a mean of updates within the bound is within it: the triangle
    inequality), so a partial passes exactly when its members' weighted mean would."""
    tensors, meta = decode_state(data)
    try:
        manifest = parse_manifest(meta)
    except ManifestError as exc:
        raise UpdateRejected("metadata", str(exc)) from None
    samples = manifest.samples
    for name, tensor in tensors.items():
        ref = reference.get(name)
        if ref is not None and tensor.dtype != ref.dtype:
            raise UpdateRejected("dtype", f"tensor '{name}' has dtype {tensor.dtype}", name)
    mean = {k: (v.to(torch.float64) / samples).to(v.dtype) for k, v in tensors.items()}
    validate_update(mean, reference, max_norm)
    return DecodedPartial(mean, samples, manifest.members, manifest.zone, manifest.round_id)


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
