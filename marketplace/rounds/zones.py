"""Regional aggregation (`aggregation.hierarchy: zones`): routing members' updates through
their zone's aggregator, and accepting the aggregator's pre-aggregated partial sums.

A task goes through a zone when its job says zones, it trains on a shard, its unit is not
replicated (a replicated unit's results are compared update by update, so they go flat),
its node is not far (a two-round task may arrive after its round closed; partials never
do) and the node's zone has an online platform aggregator other than the node itself. The
claim then carries the aggregator's address and a member token (trainer.zones); the member
tells the coordinator the hash of the update it hands over (`hand_off`), uploads it to the
aggregator, and the aggregator uploads the partial (`accept_partial`). Every member of a
partial must be a task leased to that member, handed to this aggregator with this hash and
without a result yet: otherwise the whole partial is refused and its members' tasks go back
to the queue, so no update counts twice and none is lost. An aggregator that goes offline
has its handed tasks released the same way (maintenance.reclaim_leases).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound, UpdateRejectedError
from marketplace.jobs.models_io import load_model_file
from marketplace.ledger.reservations import shrink_on_upload
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.delivery import record_model
from marketplace.rounds.lifecycle import maybe_close
from marketplace.rounds.models import Round, RoundStatus, Task, TaskResult, TaskStatus, ZonePartial
from marketplace.rounds.sizing import is_far
from marketplace.rounds.uploads import parse_metrics, release_task
from marketplace.rounds.zone_routes import (
    aggregator_for,
    replicated,
    uses_zones,
    zone_key,
)
from trainer.hashing import bytes_hash
from trainer.lora import update_part
from trainer.updates import UpdateRejected, decode_state, encode_state
from trainer.zones import decode_partial


def _aggregator(node: Node) -> Node:
    if node.kind != NodeKind.PLATFORM or not node.zone or not node.zone_url:
        raise Conflict("This node is not a zone aggregator (a platform node with a zone_url).")
    return node


def hand_off(node: Node, task_id: object, aggregator_id: int, update_hash: str) -> None:
    """The member is about to upload the task's update to its zone's aggregator: the task's
    lease now waits for the aggregator's partial (one more lease period), and the partial
    must name this hash for it."""
    if not isinstance(update_hash, str) or len(update_hash) != 64:
        raise MarketplaceError("update_hash must be the update's sha256 (64 hex digits).")
    with transaction.atomic():
        try:
            task = (
                Task.objects.select_for_update()
                .select_related("round__job")
                .get(pk=task_id, node=node)
            )
        except (Task.DoesNotExist, ValueError, TypeError, ValidationError):
            # ValidationError: a task id that is no UUID at all (Django checks it so)
            raise NotFound("No such task is leased to this node.") from None
        if task.status != TaskStatus.LEASED or task.round.status != RoundStatus.OPEN:
            raise Conflict(f"The task is {task.status}; it no longer takes updates.")
        if task.zone_aggregator_id is not None:
            if task.zone_aggregator_id == aggregator_id and task.zone_update_hash == update_hash:
                return  # a retry
            raise Conflict("This task's update was already handed to an aggregator.")
        aggregator = aggregator_for(node.zone) if uses_zones(task) else None
        if aggregator is None or str(aggregator.pk) != str(aggregator_id):
            raise Conflict("That node is not this zone's aggregator now; upload the update here.")
        task.zone_aggregator = aggregator
        task.zone_update_hash = update_hash
        task.lease_expires = timezone.now() + _lease()
        task.save(update_fields=["zone_aggregator", "zone_update_hash", "lease_expires"])


def _lease() -> Any:
    from datetime import timedelta

    return timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"])


def zone_round(node: Node, round_id: object) -> dict[str, Any]:
    """What an aggregator needs for one round: the key for its members' tokens, the job's
    spec (the codec and norm checks), the model hash, and the tasks it should expect: the
    round's leased, unreplicated shard tasks of its zone's other nodes without a result."""
    aggregator = _aggregator(node)
    rnd = _zones_round(round_id)
    leased = Task.objects.filter(
        round=rnd, status=TaskStatus.LEASED, node__zone=aggregator.zone,
        shard__isnull=False, result__isnull=True,
    ).exclude(node=aggregator)  # fmt: skip
    expected = [str(t.pk) for t in leased if not is_far(rnd.plan, t.node_id) and not replicated(t)]
    return {
        "round_id": rnd.pk,
        "job_id": str(rnd.job_id),
        "open": rnd.status == RoundStatus.OPEN,
        "key": zone_key(rnd.pk, aggregator.pk),
        "model_hash": rnd.input_model_hash,
        "spec": rnd.job.spec,
        "expected": expected,
    }


def _zones_round(round_id: object) -> Round:
    try:
        rnd = Round.objects.select_related("job").get(pk=round_id)
    except (Round.DoesNotExist, ValueError, TypeError):
        raise NotFound("No such round.") from None
    if rnd.job.parsed_spec.aggregation.hierarchy != "zones":
        raise NotFound("No such round of a job with zone aggregation.")
    return rnd


def zone_model(node: Node, round_id: object) -> bytes:
    """The round's input model, whole: the reference the aggregator validates against."""
    _aggregator(node)
    return files.get(_zones_round(round_id).input_model_file)


class _Refused(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _check_member(task: Task | None, member: Any, aggregator: Node, rnd: Round) -> None:
    if task is None or task.round_id != rnd.pk:
        raise _Refused(f"task {member.task_id} is not a task of round {rnd.number}")
    if str(task.node_id) != member.node_id or task.status != TaskStatus.LEASED:
        raise _Refused(f"task {member.task_id} is no longer leased to node {member.node_id}")
    if task.zone_aggregator_id != aggregator.pk:
        raise _Refused(f"task {member.task_id} was not handed to this aggregator")
    if task.zone_update_hash != member.update_hash:
        raise _Refused(f"task {member.task_id}'s update hash is not the one its node handed")
    if hasattr(task, "result"):
        raise _Refused(f"task {member.task_id} already has a result")
    if task.shard is None or task.shard.size != member.samples:
        raise _Refused(f"task {member.task_id}'s samples are not its shard's size")


def accept_partial(node: Node, body: bytes) -> tuple[int, ZonePartial | None]:
    """Store a zone's partial sum and one result per member; 201, or 200 for the same bytes
    again. A partial that names any member it may not is refused whole (409), and the
    members it could have counted are released to be trained again."""
    aggregator = _aggregator(node)
    limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
    if len(body) > limit:
        raise MarketplaceError(f"The partial is {len(body)} bytes; the limit is {limit}.")
    try:
        meta = decode_state(body)[1]
        round_id = json.loads(meta.get("manifest", "{}")).get("round_id")
    except (UpdateRejected, json.JSONDecodeError, AttributeError):
        raise UpdateRejectedError("The partial is not a zone partial.", reason="metadata") from None
    rnd = _zones_round(round_id)
    digest = bytes_hash(body)
    existing = ZonePartial.objects.filter(round=rnd, update_hash=digest).first()
    if existing is not None:
        return 200, existing
    spec = rnd.job.parsed_spec
    reference = update_part(spec.model, load_model_file(rnd.input_model_file))
    try:
        partial = decode_partial(body, reference, spec.aggregation.max_update_norm)
    except UpdateRejected as exc:
        raise UpdateRejectedError(f"The partial was rejected: {exc}.", reason=exc.reason) from None
    metrics = [parse_metrics(json.dumps(m.metrics)) for m in partial.members]
    name = f"{files.job_dir(rnd.job_id)}/updates/zone-{digest}.safetensors"
    files.put(name, encode_state(partial.mean), content_addressed=True)
    refused = ""
    with transaction.atomic():
        rnd = Round.objects.select_for_update().get(pk=rnd.pk)
        tasks = {
            str(t.pk): t
            for t in Task.objects.select_for_update(of=("self",))
            .filter(round=rnd, pk__in=[m.task_id for m in partial.members])
            .select_related("shard", "result")
        }
        try:
            if rnd.status != RoundStatus.OPEN:
                raise _Refused(f"round {rnd.number} is {rnd.status}")
            for member in partial.members:
                _check_member(tasks.get(member.task_id), member, aggregator, rnd)
        except _Refused as exc:
            refused = exc.why
        if not refused:
            stored = _store(rnd, aggregator, partial, tasks, metrics, name, digest, len(body))
            maybe_close(rnd)
            job_changed(rnd.job_id)
    if refused:
        _release_members(aggregator, [m.task_id for m in partial.members])
        raise Conflict(f"The partial was refused: {refused}; its members' tasks were released.")
    return 201, stored


def _store(rnd, aggregator, partial, tasks, metrics, name, digest, size) -> ZonePartial:
    manifest = [
        m.to_dict() | {"shard_hash": tasks[m.task_id].shard.content_hash} for m in partial.members
    ]
    stored = ZonePartial.objects.create(
        round=rnd, aggregator=aggregator, zone=aggregator.zone, update_file=name,
        update_hash=digest, size=size, num_samples=partial.samples, manifest=manifest,
    )  # fmt: skip
    now = timezone.now()
    lease_s = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    for member, member_metrics in zip(partial.members, metrics, strict=True):
        task = tasks[member.task_id]
        held_s = (now - task.leased_at).total_seconds() if task.leased_at else 0.0
        # billing input as for a flat upload: what the member says, capped by its lease
        result = TaskResult.objects.create(
            task=task, node_id=task.node_id, update_file="", update_hash=member.update_hash,
            num_samples=member.samples, metrics=member_metrics, partial=stored,
            compute_s=min(max(member_metrics.get("compute_s", 0.0), 0.0), held_s, lease_s),
        )  # fmt: skip
        task.status = TaskStatus.DONE
        task.save(update_fields=["status"])
        shrink_on_upload(task.pk, result.compute_s)
        record_model(task.node_id, rnd.job_id, rnd)
    return stored


def _release_members(aggregator: Node, task_ids: list[str]) -> None:
    """Tasks handed to `aggregator` whose update will not arrive from it: back to the queue
    (not the member's fault: no lost lease on its record)."""
    for task in Task.objects.filter(
        pk__in=task_ids, zone_aggregator=aggregator, status=TaskStatus.LEASED
    ).select_related("round"):
        with transaction.atomic():
            release_task(task, "zone aggregator did not deliver the update")


def release_orphans() -> int:
    """Tasks handed to an aggregator that is no longer online: released (the tick)."""
    online = online_nodes().values_list("pk", flat=True)
    orphans = Task.objects.filter(status=TaskStatus.LEASED, zone_aggregator__isnull=False)
    count = 0
    for task in orphans.exclude(zone_aggregator__in=online).select_related("round"):
        with transaction.atomic():
            release_task(task, "zone aggregator went offline before delivering the update")
            count += 1
    return count
