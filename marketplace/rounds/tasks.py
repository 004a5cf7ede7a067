"""Celery tasks: thin, idempotent wrappers around the services (acks late, retried).

They keep the names they were registered under when they lived in marketplace.jobs.tasks:
messages already queued and the beat schedule name them so."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from marketplace.server.routing import AGGREGATE_ROUND, CHECK_PARTIAL, CHECK_UPDATE


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    name=AGGREGATE_ROUND,
)
def aggregate_round(self: Any, round_id: int) -> None:
    from marketplace.rounds.aggregation import run_aggregation

    run_aggregation(round_id)


@shared_task(
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    name=CHECK_UPDATE,
)
def check_update(task_id: str) -> None:
    from marketplace.rounds.update_checks import check_received

    check_received(task_id)


@shared_task(
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    name=CHECK_PARTIAL,
)
def check_partial(received_id: int) -> None:
    from marketplace.rounds.zone_checks import check_received_partial

    check_received_partial(received_id)


@shared_task(acks_late=True, name="marketplace.jobs.tasks.tick")
def tick() -> dict[str, Any]:
    from marketplace.rounds.maintenance import tick as run_tick

    return run_tick()
