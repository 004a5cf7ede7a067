"""A zone partial's manifest (trainer.zones): the JSON in its safetensors metadata naming the
round and every member. Parsed without torch, so the coordinator's web process can read
which round and which tasks a partial names from its header alone (issue 36); the worker's
decoding (`trainer.zones.decode_partial`) reads it with the same rules."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PARTIAL_KIND = "zone-partial"
MAX_MEMBERS = 256  # one partial's manifest must fit the safetensors metadata (64 KiB)


class ManifestError(ValueError):
    """The metadata is not a zone partial's manifest; the message says why."""


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


@dataclass(frozen=True)
class Manifest:
    members: list[Member]
    samples: int
    zone: str
    round_id: str


def _member(raw: Any) -> Member:
    if not isinstance(raw, dict):
        raise ManifestError("a manifest member is not an object")
    try:
        samples = raw["samples"]
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ManifestError("a member's samples must be a whole number >= 1")
        metrics = raw.get("metrics") or {}
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in metrics.values()
        ):
            raise ManifestError("a member's metrics must be finite numbers")
        return Member(
            str(raw["task_id"]), str(raw["node_id"]), str(raw["update_hash"]), samples,
            {str(k): float(v) for k, v in metrics.items()},
        )  # fmt: skip
    except KeyError as exc:
        raise ManifestError(f"a manifest member lacks {exc.args[0]!r}") from None


def parse_manifest(metadata: Mapping[str, str]) -> Manifest:
    """The manifest in a partial's metadata, checked: its kind, 1 to MAX_MEMBERS members,
    each well formed, no task twice, and the samples adding up."""
    try:
        manifest = json.loads(metadata.get("manifest", ""))
    except json.JSONDecodeError:
        raise ManifestError("the partial's manifest is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != PARTIAL_KIND:
        raise ManifestError(f"the payload is not a {PARTIAL_KIND}")
    raw_members = manifest.get("members")
    if not isinstance(raw_members, list) or not 1 <= len(raw_members) <= MAX_MEMBERS:
        raise ManifestError(f"a partial names 1 to {MAX_MEMBERS} members")
    members = [_member(m) for m in raw_members]
    if len({m.task_id for m in members}) != len(members):
        raise ManifestError("a task appears twice in the manifest")
    samples = sum(m.samples for m in members)
    if manifest.get("samples") != samples:
        raise ManifestError("the manifest's samples are not its members' sum")
    return Manifest(
        members, samples, str(manifest.get("zone", "")), str(manifest.get("round_id", ""))
    )
