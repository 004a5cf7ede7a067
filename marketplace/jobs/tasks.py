"""Celery tasks of jobs: thin wrappers around the services."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from marketplace.jobs.models import Job
from marketplace.server.routing import EXPORT_MODEL, PREPARE_JOB

log = logging.getLogger(__name__)


@shared_task(acks_late=True, name=PREPARE_JOB)
def prepare_job(job_id: str) -> None:
    from marketplace.jobs.preparation import prepare_job as run

    run(job_id)


@shared_task(acks_late=True, name=EXPORT_MODEL)
def export_model(job_id: str, fmt: str) -> None:
    from marketplace.jobs.export_making import make_export

    make_export(job_id, fmt)


@shared_task(acks_late=True, name="marketplace.jobs.tasks.track_round")
def track_round(job_id: str, number: int) -> None:
    from marketplace.jobs.tracking import track_round as run

    run(job_id, number)


def enqueue_tracking(job: Job, number: int) -> None:
    """Log round `number` to the job's trackers once the surrounding transaction commits, in a
    task of its own: the aggregation never waits on a tracker, nor fails with one."""
    if not job.parsed_spec.tracking.backends:
        return
    job_id = str(job.pk)
    transaction.on_commit(lambda: _send(job_id, number))


def _send(job_id: str, number: int) -> None:
    try:
        track_round.delay(job_id, number)
    except Exception:  # a broker that is down loses the tracking, never the round
        log.exception("job %s round %s: could not enqueue tracking", job_id, number)
