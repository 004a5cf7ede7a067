"""The worker's check of a received zone partial (rounds.zones took it in without torch):
decoded against the round's model, then accepted as the request used to accept it (a
ZonePartial, one TaskResult per member, the round perhaps closed), or refused whole: its
members' tasks go back to the queue with the reason in their last_error."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import MarketplaceError
from marketplace.ledger.reservations import shrink_on_upload
from marketplace.rounds.delivery import record_model
from marketplace.rounds.lifecycle import maybe_close
from marketplace.rounds.models import (
    ReceivedPartial,
    Round,
    Task,
    TaskResult,
    TaskStatus,
    ZonePartial,
)
from marketplace.rounds.uploads import billed_seconds, parse_metrics
from marketplace.rounds.zone_routes import PARTIAL_FAILED
from marketplace.rounds.zones import member_tasks, refusal, release_members

if TYPE_CHECKING:  # the worker's side: torch, imported where it is used
    from trainer.zones import DecodedPartial

Decoded = tuple["DecodedPartial", list[dict[str, float]], str]  # the partial, metrics, its file


def check_received_partial(received_id: object) -> None:
    """Check the received partial, if it is still waiting (a redelivered message, or one the
    tick sent again, finds it gone: an earlier delivery checked it)."""
    received = (
        ReceivedPartial.objects.select_related("round__job", "aggregator")
        .filter(pk=received_id)
        .first()
    )
    if received is None:
        return
    try:
        body = files.get(received.received_file)
    except FileNotFoundError:
        if not ReceivedPartial.objects.filter(pk=received.pk).exists():
            return  # checked (and its bytes deleted) by another delivery meanwhile
        raise
    from trainer.updates import UpdateRejected

    try:
        decoded = _decode(received, body)
    except UpdateRejected as exc:  # refused whole: as the request's 422 used to refuse it
        _conclude(received, f"{exc} ({exc.reason})")
        return
    except MarketplaceError as exc:  # a member's metrics out of bounds
        _conclude(received, exc.detail)
        return
    _conclude(received, "", decoded)


def _decode(received: ReceivedPartial, body: bytes) -> Decoded:
    """The partial decoded and checked (trainer.zones.decode_partial: UpdateRejected) and its
    mean stored."""
    from marketplace.jobs.models_io import load_model_file
    from trainer.lora import update_part
    from trainer.updates import encode_state
    from trainer.zones import decode_partial

    rnd = received.round
    spec = rnd.job.parsed_spec
    reference = update_part(spec.model, load_model_file(rnd.input_model_file))
    partial = decode_partial(body, reference, spec.aggregation.max_update_norm)
    metrics = [parse_metrics(json.dumps(m.metrics)) for m in partial.members]
    name = f"{files.job_dir(rnd.job_id)}/updates/zone-{received.update_hash}.safetensors"
    files.put(name, encode_state(partial.mean), content_addressed=True)
    return partial, metrics, name


def _conclude(received: ReceivedPartial, refused: str, decoded: Decoded | None = None) -> None:
    """Accept the decoded partial or refuse it, under the round's lock (the tick's
    `recheck_partials` takes it too): its members are checked again as the request checked
    them, since they may have changed while it waited."""
    aggregator = received.aggregator
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).get(pk=received.round_id)
        if not ReceivedPartial.objects.filter(pk=received.pk).delete()[0]:
            return  # the tick dropped it, or another delivery concluded it
        if decoded is not None:
            tasks = member_tasks(rnd, received.members, lock=True)
            refused = refusal(rnd, aggregator, decoded[0].members, tasks)
        if refused:
            release_members(aggregator, received.members, f"{PARTIAL_FAILED}refused: {refused}")
        elif decoded is not None:
            _store(rnd, received, tasks, *decoded)
            maybe_close(rnd)
            job_changed(rnd.job_id)
    files.delete_tree([received.received_file])


def _store(
    rnd: Round, received: ReceivedPartial, tasks: dict[str, Task], partial: DecodedPartial,
    metrics: list[dict[str, float]], name: str,
) -> ZonePartial:  # fmt: skip
    aggregator = received.aggregator
    manifest = [
        m.to_dict() | {"shard_hash": tasks[m.task_id].shard.content_hash} for m in partial.members
    ]
    stored = ZonePartial.objects.create(
        round=rnd, aggregator=aggregator, zone=aggregator.zone, update_file=name,
        update_hash=received.update_hash, size=received.size, num_samples=partial.samples,
        manifest=manifest,
    )  # fmt: skip
    now = timezone.now()
    for member, member_metrics in zip(partial.members, metrics, strict=True):
        task = tasks[member.task_id]
        result = TaskResult.objects.create(
            task=task, node_id=task.node_id, update_file="", update_hash=member.update_hash,
            num_samples=member.samples, metrics=member_metrics, partial=stored,
            compute_s=billed_seconds(member_metrics, task, now),  # as a flat upload's
        )  # fmt: skip
        task.status = TaskStatus.DONE
        task.save(update_fields=["status"])
        shrink_on_upload(task.pk, result.compute_s)
        record_model(task.node_id, rnd.job_id, rnd)
    return stored
