"""Telling a sweep that one of its trials moved, after the caller's transaction commits.

Enqueued by name, so that the round and job lifecycles that call it import nothing of the
sweep's services (which submit jobs, and so import those lifecycles)."""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction

from marketplace.server.routing import ADVANCE_SWEEP

log = logging.getLogger(__name__)


def enqueue_sweep(sweep_id: object, child_id: object = None, round_number: int = 0) -> None:
    """Once the caller's transaction commits: the sweep records the child's round (and may
    prune it), then starts trials while its budget lasts (marketplace.sweeps.services)."""
    args = (str(sweep_id), str(child_id) if child_id else "", round_number)

    def send() -> None:
        try:
            current_app.tasks[ADVANCE_SWEEP].delay(*args)
        except Exception:  # a broker that is down: the tick's preparation re-sends it
            log.exception("sweep %s: could not enqueue its step", args[0])

    transaction.on_commit(send)
