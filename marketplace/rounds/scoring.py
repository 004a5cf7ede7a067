"""Scoring jobs' results (`kind: evaluate`, `kind: inference`): checking an upload, comparing
replicas, and finishing the job once every unit of rows is in (trainer.scoring).

A scoring job has one round with a task per unit of contiguous rows. Its "aggregation" adds
up the units' results in row order: an evaluation's sums combine exactly into the job's
loss and accuracy, an inference's predictions are written as one Parquet file in the
dataset's row order. Verification is the training jobs' (marketplace.rounds.verification):
replicas of a unit are compared, here by trainer.scoring's rule, and a node in the minority
loses reliability.
"""

from __future__ import annotations

import io
import logging

from django.db import transaction
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, UpdateRejectedError
from marketplace.jobs.models import Job, JobStatus
from marketplace.jobs.services import cancel_outstanding
from marketplace.ledger.services import charge_result, release_escrow, release_unpaid
from marketplace.observability import metrics as obs
from marketplace.rounds.lifecycle import unit_states
from marketplace.rounds.models import Round, RoundStatus, Task, TaskResult
from trainer.replicas import claimed_device, claimed_precision
from trainer.scoring import (
    Predictions,
    ScoreSums,
    ScoringRejected,
    combine,
    predictions_agree,
    sums_agree,
)
from trainer.updates import UpdateRejected, decode_state

log = logging.getLogger(__name__)


def predictions_name(job: Job) -> str:
    return f"{files.job_dir(job.id)}/predictions.parquet"


def predictions_file(job: Job) -> bytes:
    """A finished inference job's predictions (Parquet), or Conflict saying why not."""
    if job.kind != "inference":
        raise Conflict(f"This is a {job.kind} job; only inference jobs have predictions.")
    if not job.rounds.filter(status=RoundStatus.DONE).exists():
        raise Conflict(f"The job is {job.status}; its predictions are not complete.")
    return files.get(predictions_name(job))


def _decode(job: Job, rows: int, body: bytes) -> ScoreSums | Predictions:
    if job.kind == "evaluate":
        # a classification row is one sample; a language model's tokens are counted by the node
        expected = rows if job.task_kind == "classification" else None
        return ScoreSums.from_bytes(body, expected_count=expected)
    return Predictions.from_bytes(body, rows=rows, num_classes=job.num_classes)


def check_result(task: Task, body: bytes) -> tuple[str, str]:
    """A scoring task's upload, checked before anything is stored; returns the precision and
    device it claims (shown, and used as training results use them)."""
    job = task.round.job
    assert task.shard is not None  # scoring jobs are never federated
    try:
        _decode(job, task.shard.size, body)
        meta = decode_state(body)[1]
        return claimed_precision(meta), claimed_device(meta)
    except ScoringRejected as exc:
        raise UpdateRejectedError(f"The {job.kind} result was rejected: {exc}.") from None
    except UpdateRejected as exc:
        raise UpdateRejectedError(
            f"The {job.kind} result was rejected: {exc}.", reason=exc.reason
        ) from None


def _load(result: TaskResult) -> ScoreSums | Predictions:
    task = result.task
    return _decode(task.round.job, task.shard.size, files.get(result.update_file))


def results_agree(a: TaskResult, b: TaskResult) -> bool:
    """Two replicas of one unit of rows agree (trainer.scoring's rule)."""
    ra, rb = _load(a), _load(b)
    if isinstance(ra, ScoreSums) and isinstance(rb, ScoreSums):
        return sums_agree(ra, rb)
    if isinstance(ra, Predictions) and isinstance(rb, Predictions):
        return predictions_agree(ra, rb)
    return False


def _parquet(rows: list[tuple[int, Predictions]], num_classes: int) -> bytes:
    """The predictions as one Parquet table in the dataset's row order: `row` (0-based in
    the uploaded file), `prediction` (the class index, labels numbered in sorted order as
    training numbered them) and `prob_<k>` for each class."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    labels = torch.cat([p.labels for _, p in rows]) if rows else torch.zeros(0, dtype=torch.long)
    probs = torch.cat([p.probs for _, p in rows]) if rows else torch.zeros(0, num_classes)
    starts = [start for start, _ in rows]
    numbers = torch.cat([torch.arange(s, s + len(p.labels)) for s, p in rows]) if rows else labels
    if starts != sorted(starts) or not torch.equal(numbers, torch.arange(len(numbers))):
        raise ValueError("the units' rows do not cover the dataset once, in order")
    columns = {"row": pa.array(numbers.numpy()), "prediction": pa.array(labels.numpy())}
    for k in range(num_classes):
        columns[f"prob_{k}"] = pa.array(probs[:, k].numpy())
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


def finish_scoring(round_id: int) -> None:
    """Combine a scoring round's results in row order and complete the job; a unit left
    with no usable result (every attempt failed or was refused) fails the job instead,
    paying the verified work, as a round that cannot be aggregated does (the caller's
    except turns the ValueError into that)."""
    rnd = Round.objects.select_related("job").get(pk=round_id)
    if rnd.status != RoundStatus.AGGREGATING:
        return
    job = rnd.job
    states = unit_states(rnd, at_deadline=True)
    results = sorted((s.result for s in states if s.result is not None),
                     key=lambda r: r.task.shard.index)  # fmt: skip
    missing = len(states) - len(results)
    if missing:  # the aggregation fails the job with this reason (aggregation.run_aggregation)
        raise ValueError(f"{missing} of the {len(states)} units of rows could not be scored: "
                         "their tasks failed on every node that took them")  # fmt: skip
    loaded = [(r, _load(r)) for r in results]
    shards = list(job.shards.filter(generation=0).order_by("index").values_list("index", "size"))
    starts, at = {}, 0
    for index, size in shards:
        starts[index], at = at, at + size
    metrics: dict[str, object] = {"round": rnd.number, "kind": job.kind, "units": len(results)}
    output = ""
    if job.kind == "evaluate":
        total = combine([s for _, s in loaded])  # type: ignore[misc]
        ev = total.evaluation
        metrics |= {"accuracy": ev.accuracy, "correct": ev.correct, "total": ev.total,
                    "loss": ev.loss, "loss_sum": total.loss_sum}  # fmt: skip
    else:
        rows = [(starts[r.task.shard.index], p) for r, p in loaded]
        output = files.put(predictions_name(job), _parquet(rows, job.num_classes))  # type: ignore[arg-type]
        metrics |= {"rows": sum(len(p.labels) for _, p in rows)}  # type: ignore[union-attr]
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).select_related("job").get(pk=round_id)
        if rnd.status != RoundStatus.AGGREGATING:
            return
        job = Job.objects.select_for_update(no_key=True).get(pk=rnd.job_id)
        used = {r.pk for r in results}
        for result in TaskResult.objects.filter(task__round=rnd).select_related(
            "task__round__job", "node"
        ):
            result.aggregated = result.pk in used
            result.credited = result.aggregated or (result.accepted and result.verified is True)
            result.save(update_fields=["aggregated", "credited"])
            if result.credited:
                charge_result(result)
            else:
                release_unpaid(result)
        rnd.status, rnd.metrics = RoundStatus.DONE, metrics
        rnd.save(update_fields=["status", "metrics"])
        obs.round_finished("done", rnd.opened_at)
        job.rounds_done = rnd.number
        # the model that was scored, for the buyer to see (and download) beside the result
        job.model_hash, job.model_file = rnd.input_model_hash, rnd.input_model_file
        fields = ["rounds_done", "model_hash", "model_file", "updated_at"]
        if job.status != JobStatus.CANCELLED:
            done = (f"evaluated {metrics.get('total')} samples" if job.kind == "evaluate"
                    else f"predicted {metrics.get('rows')} rows")  # fmt: skip
            job.status, job.stop_reason, job.finished_at = JobStatus.COMPLETED, done, timezone.now()
            fields += ["status", "stop_reason", "finished_at"]
        job.save(update_fields=fields)
        cancel_outstanding(job)
        release_escrow(job)
    log.info("job %s (%s) scored: %s %s", job.pk, job.kind, metrics, output)
