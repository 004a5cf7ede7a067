"""A buyer's request for an export the worker makes (onnx, torchscript, hf), from a web
request that imports no torch (issue 36): recorded once per job and format (jobs.models.
ModelExport), sent to the worker once the request's transaction commits.

Asking again while it is being made sends nothing; asking again long after the last message
was sent (STALE_AFTER: a message lost with a broker, a worker gone) sends another, which is
harmless where the first one is still coming: the worker leaves a finished or failed export
alone (jobs/export_making.py).
"""

from __future__ import annotations

from datetime import timedelta

from celery import current_app
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone

from marketplace.jobs.models import ExportStatus, Job, ModelExport
from marketplace.server.routing import EXPORT_MODEL

# long enough for a worker to take the message off a busy aggregation queue and trace a
# large model; a lost message costs a waiting buyer this much
STALE_AFTER = timedelta(minutes=10)


def request_export(job: Job, fmt: str, name: str) -> ModelExport:
    """The request for `job`'s current model in `fmt`, whose export (stored as `name`) the
    caller did not find: sent to the worker where it has to be. A DONE record whose file is
    still missing (the storage restored from an older backup, say) is made again."""
    now = timezone.now()
    with transaction.atomic():
        record, created = ModelExport.objects.select_for_update(no_key=True).get_or_create(
            job=job, format=fmt, defaults={"model_hash": job.model_hash, "requested_at": now}
        )
        send = created
        lost = record.status == ExportStatus.DONE and not default_storage.exists(name)
        if record.model_hash != job.model_hash or lost:  # made anew
            record.model_hash, record.status = job.model_hash, ExportStatus.PENDING
            record.error, record.starts, send = "", 0, True
        elif record.status == ExportStatus.PENDING and now - record.requested_at > STALE_AFTER:
            send = True
        if send:
            record.requested_at = now
            record.save()
            job_id = str(job.pk)
            transaction.on_commit(lambda: current_app.tasks[EXPORT_MODEL].delay(job_id, fmt))
    return record
