"""Making a job's model in an export format that builds it with torch (onnx, torchscript,
hf), in a Celery worker on the aggregation queue, never in a web process (issue 36): the
buyer's request records what it wants (jobs/export_requests.py) and answers 202 until the
export is in storage, where the next request finds it (jobs/export.py).

Idempotent: a record that is done, failed, or for an older model than the job's is left
alone, so a redelivered message, or a second one sent for a lost first, does nothing twice.
"""

from __future__ import annotations

import logging

from django.db import transaction

from marketplace.jobs import files
from marketplace.jobs.export import export_name, model_job
from marketplace.jobs.models import ExportStatus, ModelExport

log = logging.getLogger(__name__)

# a worker killed mid-export (out of memory on a large model) has its message redelivered
# (acks_late): after this many starts the export fails with a reason instead of looping
MAX_STARTS = 3


def make_export(job_id: object, fmt: str) -> None:
    from trainer.export import ExportError, TrainedModel, export_model

    with transaction.atomic():
        record = (
            ModelExport.objects.select_for_update(no_key=True)
            .select_related("job")
            .filter(job_id=job_id, format=fmt)
            .first()
        )
        if record is None or record.status != ExportStatus.PENDING:
            return
        job = record.job
        if record.model_hash != job.model_hash:  # a newer model: its request sends its own
            return
        if record.starts >= MAX_STARTS:
            record.status = ExportStatus.FAILED
            record.error = (
                f"the {fmt} export stopped without finishing {MAX_STARTS} times (the model "
                "may need more memory than the server's worker has)"
            )
            record.save(update_fields=["status", "error"])
            return
        record.starts += 1
        record.save(update_fields=["starts"])
        model_hash, stored = job.model_hash, files.get(job.model_file)
        spec = model_job(job).parsed_spec.model
    # traced outside the transaction: a large model takes a while, and holds no row locked
    try:
        exported = export_model(TrainedModel.from_bytes(stored, spec), fmt)
    except ExportError as exc:  # this model cannot go to this format: the buyer is told
        log.info("job %s: no %s export: %s", job_id, fmt, exc)
        _finish(job_id, fmt, model_hash, status=ExportStatus.FAILED, error=str(exc))
        return
    files.put(export_name(job.pk, model_hash, fmt), exported.data, content_addressed=True)
    _finish(job_id, fmt, model_hash, status=ExportStatus.DONE)


def _finish(job_id: object, fmt: str, model_hash: str, **fields: str) -> None:
    """The record's outcome, unless a newer model's request has taken the record over."""
    ModelExport.objects.filter(job_id=job_id, format=fmt, model_hash=model_hash).update(**fields)
