"""Celery tasks of sweeps: thin wrappers around the services."""

from __future__ import annotations

from celery import shared_task

from marketplace.server.routing import ADVANCE_SWEEP


@shared_task(acks_late=True, name=ADVANCE_SWEEP)
def advance_sweep(sweep_id: str, child_id: str = "", round_number: int = 0) -> None:
    from marketplace.sweeps.services import advance_sweep as run

    run(sweep_id, child_id or None, round_number)
