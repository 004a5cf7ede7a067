"""Celery tasks: thin, idempotent wrappers around the services (acks late, retried)."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    name="marketplace.jobs.tasks.aggregate_round",
)
def aggregate_round(self: Any, round_id: int) -> None:
    from marketplace.jobs.aggregation import run_aggregation

    run_aggregation(round_id)


@shared_task(acks_late=True, name="marketplace.jobs.tasks.tick")
def tick() -> dict[str, Any]:
    from marketplace.jobs.maintenance import tick as run_tick

    return run_tick()
