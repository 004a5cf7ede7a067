"""Verification by redundancy: replicas of a deterministic task must agree.

Two results that agree verify each other; a disagreement brings in a third replica
(preferably on a platform-owned node, see scheduling), and the majority decides. The node
in the minority gets no credit and loses reliability.

Replicas may run on different devices and precisions (a CPU's fp32, a GPU's bf16), so they
agree within a measured tolerance rather than bit for bit: trainer.replicas.agreement, whose
docstring gives the measurement (bench/replica_divergence.py). Each result carries the
precision its node claimed; settings.GPUFLEX["AGREEMENT_TOLERANCE"] is the tolerance for two
replicas that claim the same precision (by default the cross-device one, since one claimed
precision still runs differently on different devices; a fleet of one kind of device can
lower it to trainer.replicas.SAME_DEVICE_TOLERANCE). Replicas that claim different
precisions are never held to less than trainer.replicas.CROSS_DEVICE_TOLERANCE.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import combinations

import torch
from django.conf import settings

from marketplace.jobs import files
from marketplace.nodes.services import record_verification
from marketplace.rounds.models import Round, Task, TaskResult, TaskStatus
from marketplace.rounds.scheduling import add_replica
from trainer.replicas import Agreement, agreement
from trainer.updates import decode_state


def _state(result: TaskResult) -> dict[str, torch.Tensor]:
    state, _ = decode_state(files.get(result.update_file))
    return state


def replicas_agree(
    a: TaskResult, b: TaskResult, state_a: Mapping[str, torch.Tensor],
    state_b: Mapping[str, torch.Tensor],
) -> Agreement:  # fmt: skip
    """The agreement rule for two stored results of one unit, with their claimed precisions."""
    return agreement(
        state_a,
        state_b,
        a.precision,
        b.precision,
        same_class_tolerance=settings.GPUFLEX["AGREEMENT_TOLERANCE"],
    )


def _settle(result: TaskResult, ok: bool, others: list[TaskResult], nearest: Agreement) -> None:
    result.verified = ok
    result.verified_against = [o.node_id for o in others]
    if not ok:
        result.accepted = False
        # the distance tells an operator a cheat (far) from a tolerance problem (just over)
        result.rejection = (
            f"disagreed with the replica majority (nearest replica at relative L2 "
            f"{nearest.distance.relative_l2:.3g}, tolerance {nearest.tolerance:.3g})"
        )
    result.save(update_fields=["verified", "verified_against", "accepted", "rejection"])
    record_verification(result.node_id, ok=int(ok), bad=int(not ok), caught=not ok,
                        reason=result.rejection)  # fmt: skip


def _majority(results: list[TaskResult], agree: dict[tuple[int, int], bool]) -> list[TaskResult]:
    """The results that agree with a strict majority of the unit's results (themselves in)."""
    need = math.floor(len(results) / 2) + 1
    return [
        r for r in results
        if 1 + sum(agree[r.pk, o.pk] for o in results if o.pk != r.pk) >= need
    ]  # fmt: skip


def _verify_scoring(tasks: list[Task], results: list[TaskResult]) -> None:
    """A scoring unit's replicas, by trainer.scoring's rule, with the training jobs' majority
    and consequences: a third replica for a split pair, the minority uncredited and its
    node's reliability down."""
    from marketplace.rounds.scoring import results_agree

    agree: dict[tuple[int, int], bool] = {}
    for a, b in combinations(results, 2):
        agree[a.pk, b.pk] = agree[b.pk, a.pk] = results_agree(a, b)
    winners = _majority(results, agree)
    if not winners:
        if len(results) == 2:
            first = min(tasks, key=lambda t: t.replica)
            add_replica(first, first.steps, first.batch_size, first.codec)
            return
        for r in results:
            r.accepted, r.verified, r.rejection = False, False, "no replica majority"
            r.save(update_fields=["accepted", "verified", "rejection"])
        return
    for r in results:
        ok = r in winners
        r.verified, r.verified_against = ok, [o.node_id for o in results if o.pk != r.pk]
        if not ok:
            r.accepted = False
            r.rejection = "its results disagreed with the replica majority's"
        r.save(update_fields=["verified", "verified_against", "accepted", "rejection"])
        record_verification(r.node_id, ok=int(ok), bad=int(not ok), caught=not ok,
                            reason=r.rejection)  # fmt: skip


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
    if rnd.job.parsed_spec.scoring:
        _verify_scoring(tasks, results)
        return
    states = {r.pk: _state(r) for r in results}
    verdicts: dict[tuple[int, int], Agreement] = {}
    for a, b in combinations(results, 2):  # the rule is symmetric: each pair once
        verdicts[a.pk, b.pk] = verdicts[b.pk, a.pk] = replicas_agree(
            a, b, states[a.pk], states[b.pk]
        )
    peers = {
        r.pk: [o for o in results if o.pk != r.pk and verdicts[r.pk, o.pk].agreed] for r in results
    }
    majority = math.floor(len(results) / 2) + 1
    winners = [r for r in results if len(peers[r.pk]) + 1 >= majority]
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
        others = [o for o in results if o.pk != r.pk]
        nearest = min((verdicts[r.pk, o.pk] for o in others), key=lambda v: v.distance.relative_l2)
        _settle(r, r in winners, others, nearest)
