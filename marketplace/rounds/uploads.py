"""Accepting a node's update: ownership, idempotency, validation, then verification."""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound, UpdateRejectedError
from marketplace.ledger.reservations import release_tasks, shrink_on_upload
from marketplace.nodes.bounds import MAX_DATASET_ROWS
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.observability import metrics as obs
from marketplace.rounds.delivery import record_model
from marketplace.rounds.lifecycle import maybe_close, two_round
from marketplace.rounds.models import Round, RoundStatus, Task, TaskResult, TaskStatus
from marketplace.rounds.signals import bump_work_generation
from trainer.lora import update_part
from trainer.nesting import TooDeep, loads_json

FAIL_REASONS = {"oom", "timeout", "crashed", "sandbox", "cancelled"}
# what an update's X-GPUFlex-Metrics may report: name -> (min, max)
METRIC_BOUNDS: dict[str, tuple[float, float]] = {
    "loss": (-1e12, 1e12),
    "steps": (0, 1e9),
    "samples": (0, MAX_DATASET_ROWS),
    "compute_s": (0, 1e9),
}
MAX_ATTEMPTS = 5


def task_for_node(node: Node, task_id: object) -> Task:
    """The node's own task, or NotFound: a node never learns that another's task exists."""
    try:
        return Task.objects.select_related("round__job", "shard").get(pk=task_id, node=node)
    except (Task.DoesNotExist, ValueError, TypeError, ValidationError):
        raise NotFound("No such task is leased to this node.") from None


def parse_metrics(header: str | None) -> dict[str, float]:
    if not header:
        return {}
    try:
        raw = loads_json(header)
    except json.JSONDecodeError as exc:  # a 5,000-digit number too (trainer/nesting.py)
        raise MarketplaceError(
            f"The X-GPUFlex-Metrics header is not valid JSON: {exc.msg}."
        ) from None
    except TooDeep as exc:
        raise MarketplaceError(f"The X-GPUFlex-Metrics header is {exc}.") from None
    if not isinstance(raw, dict):
        raise MarketplaceError("The X-GPUFlex-Metrics header must be a JSON object.")
    metrics = {}
    for key, (low, high) in METRIC_BOUNDS.items():
        if key in raw:
            value = raw[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise MarketplaceError(
                    f"X-GPUFlex-Metrics field {key!r} must be a finite number.",
                    field=f"X-GPUFlex-Metrics.{key}",
                )
            if not low <= value <= high:
                raise MarketplaceError(
                    f"X-GPUFlex-Metrics field {key!r} must be between {low:g} and {high:g}.",
                    field=f"X-GPUFlex-Metrics.{key}",
                )
            metrics[key] = float(value)
    return metrics


def federated_samples(node: Node, task: Task, metrics: dict[str, float]) -> int:
    """A federated update's sample count, its weight in the average: what the node reports,
    a whole number no larger than the rows it had declared for the dataset when it took the
    lease (a node claiming more rows than it holds would outweigh every other silo, and one
    re-declaring its dataset mid-round must not raise its weight in that round)."""
    name = task.round.job.federated_dataset
    declared = task.declared_rows  # 0: none was declared then
    if declared is None:  # leased before leases recorded it (migration rounds.0006)
        declared = (node.local_dataset_rows or {}).get(name)
    reported = metrics.get("samples", 0)
    field = "X-GPUFlex-Metrics.samples"
    if reported < 1 or not float(reported).is_integer():
        raise MarketplaceError(
            "A federated update must report its sample count in X-GPUFlex-Metrics 'samples' "
            "(a whole number of at least 1).",
            field=field,
        )
    if not isinstance(declared, int) or declared < 1:
        raise MarketplaceError(
            f"This node declared no row count for its local dataset {name!r}; register it as "
            f'{{"name": "{name}", "rows": N}} in local_datasets.',
            field="local_datasets",
        )
    if reported > declared:
        raise MarketplaceError(
            f"X-GPUFlex-Metrics 'samples' is {reported:g}, more than the {declared} rows this "
            f"node had declared for {name!r} when it took this task.",
            field=field,
        )
    return int(reported)


def accept_update(node: Node, task_id: object, body: bytes, metrics_header: str | None) -> int:
    """Store a validated update; returns 201 (new) or 200 (the same bytes again)."""
    from marketplace.rounds.scoring import check_result
    from marketplace.rounds.secagg import check_masked, secure
    from marketplace.rounds.verification import verify_unit
    from trainer.hashing import bytes_hash
    from trainer.replicas import claimed_device, claimed_precision
    from trainer.updates import UpdateRejected

    task = task_for_node(node, task_id)
    digest = bytes_hash(body)
    existing = TaskResult.objects.filter(task=task).first()
    if existing is not None:
        if existing.update_hash == digest:
            return 200
        raise Conflict("A different update was already accepted for this task.")
    if task.status != TaskStatus.LEASED:
        raise Conflict(f"The task is {task.status}; it no longer takes updates.")
    limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
    if len(body) > limit:
        raise MarketplaceError(f"The update is {len(body)} bytes; the limit is {limit}.")
    metrics = parse_metrics(metrics_header)
    # checked before anything is written: a refused update leaves no file behind
    num_samples = task.shard.size if task.shard else federated_samples(node, task, metrics)
    spec = task.round.job.parsed_spec
    name = f"{files.job_dir(task.round.job_id)}/updates/{digest}.safetensors"
    meta: dict[str, str] = {}  # a training upload's metadata: its proof of learning
    if spec.scoring:  # an evaluation's sums or an inference's predictions, kept as sent
        precision, device = check_result(task, body)
        files.put(name, body, content_addressed=True)
    elif secure(task.round.job):  # a masked input (field elements), kept as sent
        meta = check_masked(task, body)
        try:
            precision, device = claimed_precision(meta), claimed_device(meta)
        except UpdateRejected as exc:
            raise UpdateRejectedError(
                f"The update was rejected: {exc}.", reason=exc.reason
            ) from None
        files.put(name, body, content_addressed=True)
    else:
        precision, device, meta = _store_update(node, task, body, name)
    lease_s = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    with transaction.atomic():
        rnd = Round.objects.select_for_update().get(pk=task.round_id)
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.node_id != node.pk:
            raise NotFound("No such task is leased to this node.")
        late = rnd.status != RoundStatus.OPEN
        if task.status != TaskStatus.LEASED or (late and not _takes_late(rnd, task)):
            raise Conflict(f"The task is {task.status}; it no longer takes updates.")
        held_s = (timezone.now() - task.leased_at).total_seconds() if task.leased_at else 0.0
        result = TaskResult.objects.create(
            task=task,
            node=node,
            update_file=name,
            update_hash=digest,
            num_samples=num_samples,
            precision=precision,
            device=device,
            metrics=metrics,
            # billing input: what the node says, never more than the time it held the lease
            compute_s=min(max(metrics.get("compute_s", 0.0), 0.0), held_s, lease_s),
            late=late,
        )
        task.status = TaskStatus.DONE
        task.save(update_fields=["status"])
        # the lease's reservation shrinks to what this upload can be charged at most
        shrink_on_upload(task.pk, result.compute_s)
        # it trained on the round's model (built from the seed, perhaps): its next delta's base
        record_model(node, rnd.job_id, rnd)
        if not late:  # a late one waits, unreplicated, for the next aggregation to fold it
            verify_unit(rnd, task)
            maybe_close(rnd)
        job_changed(rnd.job_id)
    if not spec.scoring and not secure(rnd.job):
        # drawn after the upload is in: the node could not know (marketplace/proofs)
        from marketplace.proofs.services import after_upload

        after_upload(result, meta)
    return 201


def _store_update(
    node: Node, task: Task, body: bytes, name: str
) -> tuple[str, str, dict[str, str]]:
    """Check a training update against the round's model and store it as `name`; returns
    the precision and device it claims, and its metadata."""
    from marketplace.jobs.models_io import load_model_file
    from trainer.compression import decode_any
    from trainer.privacy import noise_problem
    from trainer.replicas import claimed_device, claimed_precision
    from trainer.updates import UpdateRejected, encode_state

    # the part of the model an update carries: a LoRA job's adapters alone (trainer.lora)
    spec = task.round.job.parsed_spec
    reference = update_part(spec.model, load_model_file(task.round.input_model_file))
    try:
        # any codec the task allowed; compressed updates get the same checks after decoding
        delta, meta = decode_any(body, reference, max_norm=spec.aggregation.max_update_norm)
        # kept on the result: the stored update is re-encoded without the payload's metadata
        precision, device = claimed_precision(meta), claimed_device(meta)
    except UpdateRejected as exc:
        raise UpdateRejectedError(f"The update was rejected: {exc}.", reason=exc.reason) from None
    if (problem := noise_problem(delta, spec.privacy)) is not None:
        record_verification(node.pk, bad=1)
        raise UpdateRejectedError(f"The update was rejected: {problem}.", reason="privacy")
    # Stored decoded, so verification and aggregation read plain deltas whatever the codec;
    # the name keys the bytes the node sent, which is what makes a retried upload idempotent.
    plain = meta.get("codec", "none") == "none"
    files.put(name, body if plain else encode_state(delta), content_addressed=True)
    return precision, device, dict(meta)


def _takes_late(rnd: Round, task: Task) -> bool:
    """Its round closed while the task was in flight: kept for a later round to fold in if
    the spec folds late updates, or if it is a far node's two-round task (whatever the spec
    says: the round was not meant to wait for it)."""
    if not rnd.job.is_active:
        return False
    return rnd.job.parsed_spec.rounds.late_updates == "stale" or two_round(rnd, task)


def release_task(task: Task, reason: str, *, lost: bool = False) -> None:
    """Put a leased task back in the queue (or give up on it after too many attempts)."""
    node_id = task.node_id
    give_up = task.attempts >= MAX_ATTEMPTS
    # work in flight past its round's close (late updates folded) is not queued again
    closed = Round.objects.filter(pk=task.round_id).exclude(status=RoundStatus.OPEN).exists()
    after = TaskStatus.FAILED if give_up else TaskStatus.PENDING
    updated = Task.objects.filter(pk=task.pk, status=TaskStatus.LEASED).update(
        status=TaskStatus.CANCELLED if closed else after,
        node=None,
        lease_expires=None,
        zone_aggregator=None,
        zone_update_hash="",
        last_error=reason[:300],
    )
    if updated:
        release_tasks([task.pk])  # nothing will be charged for this lease
        obs.lease_released("lost" if lost else "released")
    if updated and lost and node_id is not None:
        record_verification(node_id, lost=1)
    if updated:
        job_changed(task.round.job_id)
    if updated and not give_up and not closed:
        transaction.on_commit(bump_work_generation)


def fail_task(node: Node, task_id: object, reason: str, detail: str) -> Any:
    if reason not in FAIL_REASONS:
        raise MarketplaceError(
            f"Unknown failure reason {reason!r}; use one of {', '.join(sorted(FAIL_REASONS))}."
        )
    task = task_for_node(node, task_id)
    with transaction.atomic():
        if task.status == TaskStatus.LEASED:
            release_task(task, f"{reason}: {detail}")
            rnd = Round.objects.select_for_update().get(pk=task.round_id)
            maybe_close(rnd)
    return task
