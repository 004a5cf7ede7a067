"""Work for the Celery worker, enqueued by task name.

The services that start work (a round closing, the tick) sit below the tasks module, which
imports them; importing it back would close an import circle. The tasks are registered when
Django starts (`RoundsConfig.ready`), so the name finds the task object itself, and its
`delay` keeps Celery's eager mode for tests.
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction

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
