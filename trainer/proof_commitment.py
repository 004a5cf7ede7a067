"""A proof of learning's commitments, in pure Python: the web process and the agent check a
revealed checkpoint with this alone (they import no torch; trainer.proof re-runs segments).

A task that trains commits, as it trains, to its state at a few step boundaries
(trainer.proof.boundaries): each checkpoint is a paused-run state (trainer.resume, one
safetensors file) and its commitment is a SHA-256 over a canonical encoding of what the
following steps depend on: the step count, every tensor (weights, optimizer moments, the
summed loss, the RNG state) by sorted name with its dtype, shape and bytes, and the
optimizer's scalars and loss scaler's state. Not over the rest of its metadata: the seconds
it took (`compute_s`) differ from one run to the next and prove nothing. So two runs that
reached the same state commit to the same hash, however the file was laid out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from typing import Any

from trainer.tensor_header import HeaderError, split

DOMAIN = b"gpuflex/segment-commitment-v1\n"
# what a checkpoint may weigh when revealed: a bound on the web process's memory, not on models
# (a reveal is one request body; the agent keeps a task's checkpoints on disk meanwhile)
MAX_CHECKPOINT_BYTES = 512 * 2**20
HEX = re.compile(r"^[0-9a-f]{64}$")


def provable(*, private: bool, codec: str, merged: bool = False) -> bool:
    """Whether a task's upload can be bound to a committed chain (trainer.proof.check_binding:
    the update is the last checkpoint's weights less the round's model). Not a private
    update (clipped and noised), not top-k's (its residual from earlier tasks is added in),
    not one merged with a paused run's progress. The task runner commits where this holds,
    and the marketplace lets a segment check stand in for a replica only there."""
    return not private and codec != "topk" and not merged


class CommitmentError(ValueError):
    """A checkpoint that cannot be read as a paused-run state; the message says why."""


def checkpoint_step(data: bytes) -> int:
    """The step count a checkpoint's metadata states."""
    return int(_meta(data)[1]["step"])


def _meta(data: bytes) -> tuple[Any, dict[str, Any]]:
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CommitmentError(
            f"the checkpoint is {len(data)} bytes; at most {MAX_CHECKPOINT_BYTES} are taken"
        )
    try:
        entries, metadata, body = split(data)
        meta = json.loads(metadata.get("gpuflex", "null"))
    except (HeaderError, ValueError) as exc:
        raise CommitmentError(f"the checkpoint cannot be read: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != "gpuflex/paused-task-v1":
        raise CommitmentError("the checkpoint is not a GPUFlex paused-run state")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CommitmentError("the checkpoint states no step count")
    return (entries, body), meta


def commitment(data: bytes) -> str:
    """The hex SHA-256 a task commits to for checkpoint `data` (see the module docstring)."""
    (entries, body), meta = _meta(data)
    h = hashlib.sha256(DOMAIN)
    h.update(f"step={meta['step']}\n".encode())
    for name in sorted(entries):
        e = entries[name]
        h.update(json.dumps([name, e.dtype, list(e.shape), e.end - e.begin]).encode() + b"\n")
        h.update(body[e.begin : e.end])
    scalars = {"opt_scalars": meta.get("opt_scalars"), "scaler": meta.get("scaler")}
    h.update(json.dumps(scalars, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def parse_claim(commitments: object, boundaries: object, steps: int) -> tuple[list[str], list[int]]:
    """An upload's claimed chain (its metadata's `commitments` and `boundaries`), checked:
    as many hex digests as step counts, at least two, strictly increasing from 0 to `steps`."""
    if not isinstance(commitments, list) or not isinstance(boundaries, list):
        raise CommitmentError("commitments and boundaries must be lists")
    if len(commitments) != len(boundaries) or len(boundaries) < 2:
        raise CommitmentError(
            f"{len(commitments)} commitments for {len(boundaries)} boundaries; need as many, "
            "at least 2"
        )
    if not all(isinstance(c, str) and HEX.match(c) for c in commitments):
        raise CommitmentError("a commitment is not a 64-digit lowercase hex SHA-256")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in boundaries):
        raise CommitmentError("a boundary is not a whole step count")
    if boundaries[0] != 0 or boundaries[-1] != steps:
        raise CommitmentError(
            f"the boundaries run from {boundaries[0]} to {boundaries[-1]}; the task has 0 to "
            f"{steps} steps"
        )
    if any(a >= b for a, b in itertools.pairwise(boundaries)):
        raise CommitmentError(f"the boundaries {boundaries} are not strictly increasing")
    return list(commitments), list(boundaries)
