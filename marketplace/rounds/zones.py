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

Like a flat upload (rounds.uploads), a partial is taken in by the web process without torch:
its header and manifest are read and its members checked here, then the bytes wait as a
ReceivedPartial for the worker's check (rounds.zone_checks), which decodes the sum against
the round's model and stores it, or refuses it and releases its members.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound, UpdateRejectedError
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import online_nodes
from marketplace.rounds.models import (
    ReceivedPartial,
    Round,
    RoundStatus,
    Task,
    TaskStatus,
    ZonePartial,
)
from marketplace.rounds.queue import enqueue_partial_check, send_checks_again
from marketplace.rounds.sizing import is_far
from marketplace.rounds.uploads import release_task
from marketplace.rounds.zone_routes import (
    PARTIAL_FAILED,
    aggregator_for,
    replicated,
    uses_zones,
    zone_key,
)
from trainer.digest import bytes_hash
from trainer.tensor_header import HeaderError, split
from trainer.zone_manifest import ManifestError, Member, parse_manifest


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
                Task.objects.select_for_update(no_key=True)
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


def _lease() -> timedelta:
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


def _check_member(task: Task | None, member: Member, aggregator: Node, rnd: Round) -> None:
    """Raise _Refused unless `member` may count in `aggregator`'s partial for `rnd`."""
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


def refusal(rnd: Round, aggregator: Node, members: list[Member], tasks: dict[str, Task]) -> str:
    """Why the partial naming `members` cannot count (its tasks as `member_tasks` read them),
    or "": a partial counts whole or not at all."""
    try:
        if rnd.status != RoundStatus.OPEN:
            raise _Refused(f"round {rnd.number} is {rnd.status}")
        for member in members:
            _check_member(tasks.get(member.task_id), member, aggregator, rnd)
    except _Refused as exc:
        return exc.why
    return ""


def _task_pks(task_ids: list[str]) -> list[uuid.UUID]:
    """The ids that can name a task (a UUID): a manifest naming another is refused for the
    task it does not find, not a server error."""
    pks = []
    for task_id in task_ids:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            pks.append(uuid.UUID(task_id))
    return pks


def member_tasks(rnd: Round, task_ids: list[str], *, lock: bool = False) -> dict[str, Task]:
    tasks = Task.objects.select_for_update(of=("self",)) if lock else Task.objects
    named = tasks.filter(round=rnd, pk__in=_task_pks(task_ids))
    return {str(t.pk): t for t in named.select_related("shard", "result")}


@dataclass(frozen=True)
class Receipt:
    """What the partial's answer says: its job (the aggregator's traffic) and its members."""

    job_id: object
    members: int


def accept_partial(node: Node, body: bytes) -> tuple[int, Receipt]:
    """Take an aggregator's partial in without torch (issue 36): 202 when it is received and
    the worker is to check it (rounds.zone_checks), 202 again for the same bytes while it
    waits, 200 for bytes already checked and accepted. What the header shows is checked
    here: a file that is no safetensors or has no zone manifest is refused (422), and a
    partial naming any member it may not is refused whole (409), the members it could have
    counted released to be trained again. The sum itself (dtypes, shapes, values, the norm
    bound) is the worker's to check; its refusal releases the members the same way, the
    reason in each task's last_error. A received partial's members stay leased, in flight,
    one more lease period while the check is due."""
    aggregator = _aggregator(node)
    limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
    if len(body) > limit:
        raise MarketplaceError(f"The partial is {len(body)} bytes; the limit is {limit}.")
    try:
        manifest = parse_manifest(split(body)[1])
    except HeaderError as exc:
        raise UpdateRejectedError(
            f"The partial was rejected: it is not a safetensors file: {exc}.", reason="corrupt"
        ) from None
    except ManifestError as exc:
        raise UpdateRejectedError(
            f"The partial is not a zone partial: {exc}.", reason="metadata"
        ) from None
    rnd = _zones_round(manifest.round_id)
    digest = bytes_hash(body)
    receipt = Receipt(rnd.job_id, len(manifest.members))
    if ZonePartial.objects.filter(round=rnd, update_hash=digest).exists():
        return 200, receipt
    if ReceivedPartial.objects.filter(round=rnd, update_hash=digest).exists():
        return 202, receipt
    task_ids = [m.task_id for m in manifest.members]
    # checked before anything is written: a partial refused here leaves no file behind
    refused = refusal(rnd, aggregator, manifest.members, member_tasks(rnd, task_ids))
    if not refused:
        name = received_partial_name(rnd.job_id, digest)
        files.put(name, body, content_addressed=True)
        with transaction.atomic():
            rnd = Round.objects.select_for_update(no_key=True).get(pk=rnd.pk)
            # a retry racing this one, or checked and accepted since the first look
            if ReceivedPartial.objects.filter(round=rnd, update_hash=digest).exists():
                return 202, receipt
            if ZonePartial.objects.filter(round=rnd, update_hash=digest).exists():
                return 200, receipt
            tasks = member_tasks(rnd, task_ids, lock=True)
            refused = refusal(rnd, aggregator, manifest.members, tasks)
            if not refused:
                received = ReceivedPartial.objects.create(
                    round=rnd, aggregator=aggregator, received_file=name, update_hash=digest,
                    size=len(body), members=task_ids,
                )  # fmt: skip
                # its members wait for the check now, not for the aggregator (as a hand-off
                # waits for it): one more lease period, then the tick releases them
                Task.objects.filter(pk__in=task_ids).update(lease_expires=timezone.now() + _lease())
                enqueue_partial_check(received.pk)
        if refused:  # the state changed between the two looks: nothing refers to the file
            files.delete_tree([name])
    if refused:
        release_members(aggregator, task_ids, f"{PARTIAL_FAILED}refused: {refused}")
        raise Conflict(f"The partial was refused: {refused}; its members' tasks were released.")
    return 202, receipt


def received_partial_name(job_id: object, digest: str) -> str:
    """Where a partial's bytes as sent wait for the worker (beside received updates)."""
    return f"{files.job_dir(job_id)}/received/zone-{digest}.safetensors"


def release_members(aggregator: Node, task_ids: list[str], reason: str) -> None:
    """Tasks handed to `aggregator` whose update will not count through it: back to the
    queue (not the member's fault: no lost lease on its record), `reason` their last_error."""
    for task in Task.objects.filter(
        pk__in=_task_pks(task_ids), zone_aggregator=aggregator, status=TaskStatus.LEASED
    ).select_related("round"):
        with transaction.atomic():
            release_task(task, reason)


def release_orphans() -> int:
    """Tasks handed to an aggregator that is no longer online: released (the tick). Members
    of a partial it delivered, waiting for the worker's check, are not orphans: their update
    is here (`recheck_partials` ends the wait)."""
    online = online_nodes().values_list("pk", flat=True)
    orphans = Task.objects.filter(status=TaskStatus.LEASED, zone_aggregator__isnull=False)
    delivered = {
        t for ids in ReceivedPartial.objects.values_list("members", flat=True) for t in ids
    }
    count = 0
    for task in orphans.exclude(zone_aggregator__in=online).select_related("round"):
        if str(task.pk) in delivered:
            continue
        with transaction.atomic():
            release_task(task, "zone aggregator went offline before delivering the update")
            count += 1
    return count


def recheck_partials() -> int:
    """Received partials whose check has not come (the tick): a lost check is sent again as
    a received update's is (rounds.queue.send_checks_again), and after a lease the partial
    is dropped and its members released, the reason in their last_error, as a received
    update's task is reclaimed then. Returns how many were dropped."""
    now = timezone.now()
    lease = _lease()
    waiting = ReceivedPartial.objects.filter(received_at__gte=now - lease)
    send_checks_again(waiting, "pk", enqueue_partial_check)
    dropped = 0
    for received in ReceivedPartial.objects.filter(received_at__lt=now - lease).select_related(
        "aggregator"
    ):
        with transaction.atomic():
            Round.objects.select_for_update(no_key=True).get(
                pk=received.round_id
            )  # the check's lock
            if not ReceivedPartial.objects.filter(pk=received.pk).delete()[0]:
                continue  # the check got there first
            why = f"{PARTIAL_FAILED}was received but not checked within a lease"
            release_members(received.aggregator, received.members, why)
            dropped += 1
        files.delete_tree([received.received_file])
    return dropped
