"""Experiment tracking for a job: its rounds and costs read from the database, handed to the
trackers of trainer/tracking.py.

A round is logged after its aggregation commits (`marketplace.jobs.tasks.enqueue_tracking`, from
marketplace/rounds/aggregation.py), by a Celery task of its own: a tracker that is slow or
down never holds the aggregation's transaction, and its failure is logged, never the round's.
Every store is the server's choice (trainer/spec.py TrackingSpec): MLflow's default `file:`
store, TensorBoard's event files and W&B's offline run all live under this job's folder in
the data directory; only an MLflow http(s) URI points elsewhere.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.ledger.models import Transaction, TxKind
from marketplace.rounds.models import Round, RoundStatus, TaskResult, ZonePartial
from trainer.tracking import (
    JobRecord,
    MLflowTracker,
    RoundRecord,
    TensorBoardTracker,
    Tracker,
    WandbTracker,
    check_public_url,
    log_job,
    spec_params,
)

log = logging.getLogger(__name__)


def tracking_dir(job: Job) -> Path:
    """This job's own folder for local tracking stores; nothing in the spec can move it."""
    return Path(settings.DATA_DIR) / "tracking" / str(job.pk)


def _experiment(job: Job) -> str:
    return job.parsed_spec.tracking.experiment or "gpuflex"


def _costs_by_round(job: Job) -> dict[int, Decimal]:
    totals: dict[int, Decimal] = {}
    for tx in Transaction.objects.filter(job=job, kind=TxKind.CHARGE).only("details"):
        number = int(tx.details.get("round", 0))
        totals[number] = totals.get(number, Decimal(0)) + Decimal(tx.details["gross"])
    return totals


def _upload_bytes(rnd: Round) -> int:
    # a zone's members upload to its aggregator: the coordinator received each partial once
    total = sum(ZonePartial.objects.filter(round=rnd).values_list("size", flat=True))
    flat = TaskResult.objects.filter(task__round=rnd).exclude(update_file="")
    for name in flat.values_list("update_file", flat=True):
        try:
            total += files.size(name)
        except OSError:  # retention may have removed old updates: count what is left
            continue
    return total


def job_rounds(job: Job, upto: int | None = None) -> list[RoundRecord]:
    """Each finished round's metrics: accuracy, loss, the nodes aggregated, the update bytes
    uploaded and the money charged up to and including it (`cost`)."""
    costs = _costs_by_round(job)
    rounds = Round.objects.filter(job=job, status=RoundStatus.DONE).order_by("number")
    if upto is not None:
        rounds = rounds.filter(number__lte=upto)
    out = []
    for rnd in rounds:
        m = rnd.metrics
        cost = sum((c for n, c in costs.items() if n <= rnd.number), Decimal(0))
        metrics: dict[str, Any] = {
            "accuracy": m.get("accuracy"),
            "loss": m.get("loss"),
            "nodes": m.get("participants"),
            "upload_bytes": _upload_bytes(rnd),
            "cost": float(cost),
        }
        out.append(RoundRecord(rnd.number, {k: v for k, v in metrics.items() if v is not None}))
    return out


def job_params(job: Job) -> dict[str, str]:
    return spec_params(job.spec) | {"job.id": str(job.pk), "job.tier": job.tier}


def job_record(job: Job, model: Path | None = None) -> JobRecord:
    return JobRecord(str(job.pk), job.name, job_params(job), job_rounds(job), model)


def _trackers(job: Job, names: list[str]) -> list[Tracker]:
    spec = job.parsed_spec.tracking
    base = tracking_dir(job)
    out: list[Tracker] = []
    for name in names:
        if name == "mlflow":
            uri = spec.mlflow_uri or f"file:{base / 'mlflow'}"
            if spec.mlflow_uri and not settings.GPUFLEX["TRACKING_ALLOW_PRIVATE"]:
                check_public_url(uri)  # resolved each time: an address may change
                # and only the first host is checked: a public server's redirect (307 to
                # 127.0.0.1) must not lead this process into its own network, so MLflow,
                # which reads this at every request, follows none (a redirect is a failure)
                os.environ["MLFLOW_ALLOW_HTTP_REDIRECTS"] = "false"
            out.append(MLflowTracker(uri, _experiment(job), str(job.pk), job.name))
        elif name == "tensorboard":
            out.append(TensorBoardTracker(base / "tensorboard"))
        elif name == "wandb":
            out.append(WandbTracker(base / "wandb", _experiment(job), str(job.pk), job.name))
    return out


def track_round(job_id: object, number: int) -> None:
    """Log round `number` to the job's incremental trackers; once the job has ended, the final
    model too, and the whole record to the others (W&B offline). Never raises: tracking is
    the buyer's convenience, not part of the round."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return
    backends = list(job.parsed_spec.tracking.backends)
    for name in backends:
        try:
            _track(job, name, number)
        except Exception:
            log.exception("job %s round %s: tracking to %s failed", job.pk, number, name)


KINDS: dict[str, type[Tracker]] = {
    "mlflow": MLflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker,
}  # fmt: skip


def _track(job: Job, name: str, number: int) -> None:
    ended = not job.is_active and job.rounds_done == number
    if not KINDS[name].incremental and not ended:
        return  # logged whole once the job ends
    (tracker,) = _trackers(job, [name])
    if not tracker.incremental:
        with _final_model(job) as model:
            log_job(tracker, job_record(job, model))
        return
    if number == 1 or ended:
        tracker.log_params(job_params(job))
    for rnd in job_rounds(job, upto=number):
        if rnd.step == number:
            tracker.log_metrics(rnd.step, rnd.metrics)
    if ended:
        with _final_model(job) as model:
            tracker.log_artifact(model)
    tracker.close(finished=ended)


@contextmanager
def _final_model(job: Job) -> Iterator[Path]:
    """The job's final model as a file named JOB.safetensors, for trackers' artifacts."""
    with tempfile.TemporaryDirectory(prefix="gpuflex-track-") as tmp:
        path = Path(tmp) / f"{job.pk}.safetensors"
        path.write_bytes(files.get(job.model_file))
        yield path
