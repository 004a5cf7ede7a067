"""Celery task: the segment re-run, in the worker (it imports torch; the web never does)."""

from __future__ import annotations

from celery import shared_task

from marketplace.server.routing import RUN_SEGMENT_CHECK


@shared_task(acks_late=True, name=RUN_SEGMENT_CHECK)
def run_segment_check(check_id: int) -> str:
    from marketplace.proofs.worker import run_check

    return run_check(check_id)
