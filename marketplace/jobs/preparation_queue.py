"""Sending a stored job to the worker that prepares it (jobs/preparation.py), from a web
request that imports no torch (issue 36): the preparation module itself builds models."""

from __future__ import annotations

from celery import current_app
from django.db import transaction

from marketplace.server.routing import PREPARE_JOB


def enqueue_preparation(job_id: object) -> None:
    """Once the caller's transaction commits: a rolled-back submission prepares nothing."""
    job = str(job_id)
    transaction.on_commit(lambda: current_app.tasks[PREPARE_JOB].delay(job))
