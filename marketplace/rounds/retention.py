"""An ended job's working files go: its dataset, shards, round models, deltas, updates and
checkpoint. What the buyer paid for stays: the final model and the provenance record (the
content-addressed artifact store that provenance is verified against is kept apart, under
DATA_DIR/artifacts, and is not touched here).

Pruning waits ENDED_JOB_FILES_GRACE_S after the job ends and until no round is still
aggregating, so an aggregation finishing a cancelled job, or an upload already in its
transaction, never finds its inputs gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.db.models import Exists, OuterRef
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.models import Job, JobStatus
from marketplace.rounds.aggregation import provenance_name
from marketplace.rounds.models import Round, RoundStatus

ENDED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STOPPED)


def stored_names(prefix: str) -> Iterator[str]:
    """Every stored file under `prefix`, on any storage (filesystem or S3)."""
    try:
        folders, names = default_storage.listdir(prefix)
    except FileNotFoundError:
        return
    for name in names:
        yield f"{prefix}/{name}"
    for folder in folders:
        yield from stored_names(f"{prefix}/{folder}")


def prune_job_files(job: Job) -> int:
    """Delete the job's files but the final model and provenance; returns how many went."""
    kept = {job.model_file, provenance_name(job)}
    doomed = [n for n in stored_names(files.job_dir(job.pk)) if n not in kept]
    files.delete_tree(doomed)
    return len(doomed)


def prune_ended_jobs() -> int:
    """The tick's sweep: jobs ended past the grace period, each pruned once."""
    grace = timedelta(seconds=settings.GPUFLEX["ENDED_JOB_FILES_GRACE_S"])
    aggregating = Round.objects.filter(job=OuterRef("pk"), status=RoundStatus.AGGREGATING)
    due = Job.objects.filter(
        status__in=ENDED,
        finished_at__lte=timezone.now() - grace,
        files_pruned_at__isnull=True,
    ).exclude(Exists(aggregating))
    pruned = 0
    for job in due:
        pruned += prune_job_files(job)
        Job.objects.filter(pk=job.pk).update(files_pruned_at=timezone.now())
    return pruned
