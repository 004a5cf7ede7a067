"""Ending and steering a job: the buyer's pause, resume and cancel, and failure."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs.errors import Conflict
from marketplace.jobs.models import Job, JobStatus
from marketplace.ledger.services import release_escrow
from marketplace.observability import metrics as obs
from marketplace.rounds.lifecycle import round_deadline
from marketplace.rounds.models import Round, RoundStatus, Task, TaskStatus
from marketplace.rounds.signals import bump_work_generation
from marketplace.sweeps.queue import enqueue_sweep


def _locked(job: Job) -> Job:
    return Job.objects.select_for_update(no_key=True).get(pk=job.pk)


@transaction.atomic
def pause_job(job: Job) -> Job:
    """No new leases; work already leased may still be uploaded."""
    job = _locked(job)
    if job.status != JobStatus.RUNNING:
        raise Conflict(f"Only a running job can be paused; this one is {job.status}.")
    job.status = JobStatus.PAUSED
    job.save(update_fields=["status", "updated_at"])
    job_changed(job.pk)
    return job


@transaction.atomic
def resume_job(job: Job) -> Job:
    job = _locked(job)
    if job.status != JobStatus.PAUSED:
        raise Conflict(f"Only a paused job can be resumed; this one is {job.status}.")
    job.status = JobStatus.RUNNING
    job.save(update_fields=["status", "updated_at"])
    # the pause should not count against the round's deadline: a full period from now (the
    # round's own, its plan's when it has one)
    for rnd in Round.objects.filter(job=job, status=RoundStatus.OPEN):
        rnd.deadline = round_deadline(job, period_s=rnd.deadline_s)
        rnd.save(update_fields=["deadline"])
    transaction.on_commit(bump_work_generation)
    job_changed(job.pk)
    if job.kind == "sweep":  # a paused sweep started no trials: it may start them now
        enqueue_sweep(job.pk)
    return job


@transaction.atomic
def cancel_job(job: Job) -> Job:
    """A sweep's running trials are cancelled with it (first: their escrow returns to the
    sweep's, which then goes back to the buyer)."""
    job = _locked(job)
    if not job.is_active:
        raise Conflict(f"The job is already {job.status}.")
    for child in (
        Job.objects.select_for_update(no_key=True).filter(parent=job).order_by("created_at")
    ):
        if child.is_active:
            _end(child, JobStatus.CANCELLED)
    _end(job, JobStatus.CANCELLED)
    return job


def fail_job(job: Job, error: str) -> Job:
    """End a job that cannot go on, saying why in `error`. The caller holds the job's lock
    and has already settled and closed any round that was aggregating. A job the buyer has
    cancelled keeps that status, but gets the escrow release that cancel_job left to the
    aggregation."""
    if job.is_active:
        _end(job, JobStatus.FAILED, error)
    else:
        release_escrow(job)
    return job


def stop_job(job: Job, reason: str, stop_reason: str = "") -> Job:
    """End a job its budget can no longer pay for, or a sweep's trial its pruner stops
    (stop_reason "pruned"); the caller holds the job's lock. Says why in `error`; its
    unspent escrow goes back to the buyer (a trial's to its sweep)."""
    if job.is_active:
        _end(job, JobStatus.STOPPED, reason, stop_reason or reason)
    return job


def cancel_outstanding(job: Job) -> None:
    """A job that ended: its work not started, or still in flight (late updates to fold),
    has nothing left to join."""
    Task.objects.filter(round__job=job, status__in=[TaskStatus.PENDING, TaskStatus.LEASED]).update(
        status=TaskStatus.CANCELLED
    )


def _end(job: Job, status: str, error: str = "", stop_reason: str = "") -> None:
    """Stop an active job's outstanding work and, unless a round is still aggregating,
    release its unspent escrow. A sweep's trial tells its sweep (which starts the next)."""
    job.status, job.error, job.finished_at = status, error or job.error, timezone.now()
    job.stop_reason = stop_reason or job.stop_reason
    job.save(update_fields=["status", "error", "stop_reason", "finished_at", "updated_at"])
    job_changed(job.pk)
    if job.parent_id:
        enqueue_sweep(job.parent_id)
    cancel_outstanding(job)
    still_open = Round.objects.filter(job=job, status=RoundStatus.OPEN)
    obs.rounds_cancelled(list(still_open.values_list("opened_at", flat=True)))
    still_open.update(status=RoundStatus.CANCELLED, closed_at=timezone.now())
    if not Round.objects.filter(job=job, status=RoundStatus.AGGREGATING).exists():
        # else the aggregation still pays its verified work, then releases the rest
        release_escrow(job)
