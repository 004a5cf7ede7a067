"""Verification by redundancy: replicas of a deterministic task must agree.

Two results that agree verify each other; a disagreement brings in a third replica
(preferably on a platform-owned node, see scheduling), and the majority decides. The node
in the minority gets no credit and loses reliability.
"""

from __future__ import annotations

import math

import torch
from django.conf import settings

from marketplace.jobs import files
from marketplace.jobs.models import Round, Task, TaskResult, TaskStatus
from marketplace.jobs.scheduling import add_replica
from marketplace.nodes.services import record_verification
from trainer.aggregation import flatten_state
from trainer.updates import decode_state


def _vector(result: TaskResult) -> torch.Tensor:
    state, _ = decode_state(files.get(result.update_file))
    return flatten_state(state, dtype=torch.float64)


def agree(a: torch.Tensor, b: torch.Tensor, tolerance: float | None = None) -> bool:
    """Relative L2 distance within tolerance (identical bits on the same kind of device)."""
    tol = settings.GPUFLEX["AGREEMENT_TOLERANCE"] if tolerance is None else tolerance
    scale = max(float(a.norm()), float(b.norm()), 1e-12)
    return float((a - b).norm()) / scale <= tol


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = float(a.norm()) * float(b.norm())
    return float(a @ b) / denom if denom > 0 else 0.0


def _settle(result: TaskResult, ok: bool, others: list[TaskResult]) -> None:
    result.verified = ok
    result.verified_against = [o.node_id for o in others]
    if not ok:
        result.accepted = False
        result.rejection = "disagreed with the replica majority"
    result.save(update_fields=["verified", "verified_against", "accepted", "rejection"])
    record_verification(result.node_id, ok=int(ok), bad=int(not ok))


def verify_unit(rnd: Round, task: Task) -> None:
    """Compare the unit's results once every replica has reported; the caller holds the
    round's row lock, so two uploads of one unit never verify concurrently."""
    if task.shard_id is None:
        return  # a federated task has no replicas: statistics are its only check
    tasks = list(Task.objects.filter(round=rnd, shard_id=task.shard_id).select_related("result"))
    if any(t.status in (TaskStatus.PENDING, TaskStatus.LEASED) for t in tasks):
        return
    results = [t.result for t in tasks if hasattr(t, "result") and t.result.verified is None]
    if len(results) < 2:
        return
    vectors = {r.pk: _vector(r) for r in results}
    for r in results:
        peers = [o for o in results if o.pk != r.pk and agree(vectors[r.pk], vectors[o.pk])]
        r._peers = peers  # type: ignore[attr-defined]
    majority = math.floor(len(results) / 2) + 1
    winners = [r for r in results if len(r._peers) + 1 >= majority]  # type: ignore[attr-defined]
    if not winners:
        if len(results) == 2:
            # one of the two is wrong and we cannot tell which: ask a third node
            first = min(tasks, key=lambda t: t.replica)
            add_replica(first, first.steps, first.batch_size, first.codec)
            return
        for r in results:  # no majority among three or more: nobody is trusted or credited
            r.accepted, r.verified, r.rejection = False, False, "no replica majority"
            r.save(update_fields=["accepted", "verified", "rejection"])
        return
    for r in results:
        _settle(r, r in winners, [o for o in results if o.pk != r.pk])
