"""Work for the Celery worker, enqueued by task name.

The services that start work (a round closing, the tick) sit below the tasks module, which
imports them; importing it back would close an import circle. The tasks are registered when
Django starts (`RoundsConfig.ready`), so the name finds the task object itself, and its
`delay` keeps Celery's eager mode for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

# the name it had in marketplace.jobs.tasks, kept so that queued messages still find it;
# it is routed to a queue of its own (marketplace/server/routing.py)
from marketplace.server.routing import AGGREGATE_ROUND, CHECK_PARTIAL, CHECK_UPDATE


def enqueue_aggregation(round_id: int) -> None:
    """Once the caller's transaction commits: a rolled-back close enqueues nothing."""
    transaction.on_commit(lambda: current_app.tasks[AGGREGATE_ROUND].delay(round_id))


def enqueue_update_check(task_id: object) -> None:
    """Once the upload's row is committed: the worker reads it (rounds.update_checks)."""
    task_id = str(task_id)
    transaction.on_commit(lambda: current_app.tasks[CHECK_UPDATE].delay(task_id))


def enqueue_partial_check(received_id: int) -> None:
    """Once the partial's row is committed: the worker reads it (rounds.zone_checks)."""
    transaction.on_commit(lambda: current_app.tasks[CHECK_PARTIAL].delay(received_id))


def send_checks_again(waiting: QuerySet, arg: str, enqueue: Callable[[Any], None]) -> int:
    """Of the received rows `waiting` (ReceivedUpdate, ReceivedPartial: `check_enqueued_at`,
    `checks`), those whose check was enqueued more than STUCK_AGGREGATION_S ago are enqueued
    again with their `arg` (the tick): a worker killed holding the message returns it to the
    broker only after the broker's visibility timeout (an hour on Redis). Once a period per
    row, not on every tick; a check that did run meanwhile finds its row gone."""
    cutoff = timezone.now() - timedelta(seconds=settings.GPUFLEX["STUCK_AGGREGATION_S"])
    rows = waiting.model.objects
    sent = 0
    for pk, value in waiting.filter(check_enqueued_at__lt=cutoff).values_list("pk", arg):
        with transaction.atomic():
            # only if no other tick took it meanwhile; enqueued once this commits
            if rows.filter(pk=pk, check_enqueued_at__lt=cutoff).update(
                check_enqueued_at=timezone.now(), checks=F("checks") + 1
            ):
                enqueue(value)
                sent += 1
    return sent
