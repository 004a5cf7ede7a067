"""Receiving a node's update in the web process: ownership, idempotency, the checks that
need no torch, then the bytes stored and the worker's check enqueued (rounds.update_checks)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound, UpdateRejectedError
from marketplace.jobs.model_headers import model_header
from marketplace.ledger.reservations import release_tasks
from marketplace.nodes.bounds import MAX_DATASET_ROWS
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.observability import metrics as obs
from marketplace.rounds.lifecycle import maybe_close, two_round
from marketplace.rounds.models import (
    ReceivedUpdate,
    RefusedUpdate,
    Round,
    RoundStatus,
    Task,
    TaskResult,
    TaskStatus,
)
from marketplace.rounds.queue import enqueue_update_check
from marketplace.rounds.signals import bump_work_generation
from trainer.digest import bytes_hash
from trainer.lora import update_part
from trainer.nesting import TooDeep, loads_json
from trainer.secagg.packed import MASKED_KEY
from trainer.tensor_header import UPLOAD_DTYPE_BYTES, Entry, HeaderError, split

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
    """Take an update in without torch (issue 36): 202 when it is received and the worker is
    to check it (rounds.update_checks), 202 again for the same bytes while it waits, 200 for
    bytes already checked and accepted. What the header alone shows to be wrong is refused
    here; the rest (values, norm, privacy noise, codec layouts) is the worker's check, whose
    rejection releases the task with the reason in its last_error."""
    task = task_for_node(node, task_id)
    digest = bytes_hash(body)
    for earlier in (
        TaskResult.objects.filter(task=task).first(),
        ReceivedUpdate.objects.filter(task=task).first(),
    ):
        if earlier is not None:
            if earlier.update_hash == digest:
                return 200 if isinstance(earlier, TaskResult) else 202
            raise Conflict("A different update was already accepted for this task.")
    if task.status != TaskStatus.LEASED:
        raise Conflict(f"The task is {task.status}; it no longer takes updates.")
    limit = settings.GPUFLEX["MAX_UPDATE_BYTES"]
    if len(body) > limit:
        raise MarketplaceError(f"The update is {len(body)} bytes; the limit is {limit}.")
    metrics = parse_metrics(metrics_header)
    # checked before anything is written: a refused update leaves no file behind
    num_samples = task.shard.size if task.shard else federated_samples(node, task, metrics)
    try:
        # every codec's payload, a masked input and a scoring result are safetensors files
        entries, metadata, _ = split(body, UPLOAD_DTYPE_BYTES)
    except HeaderError as exc:
        raise UpdateRejectedError(
            f"The update was rejected: it is not a safetensors file: {exc}.", reason="corrupt"
        ) from None
    check_layout(task, entries, metadata)
    name = received_name(task.round.job_id, task.pk, digest)
    files.put(name, body, content_addressed=True)
    with transaction.atomic():
        task = Task.objects.select_for_update(no_key=True).get(pk=task.pk)
        if task.node_id != node.pk:
            raise NotFound("No such task is leased to this node.")
        if task.status != TaskStatus.LEASED:
            raise Conflict(f"The task is {task.status}; it no longer takes updates.")
        earlier = ReceivedUpdate.objects.filter(task=task).first()  # a retry racing this one
        if earlier is not None:
            if earlier.update_hash == digest:
                return 202
            raise Conflict("A different update was already accepted for this task.")
        ReceivedUpdate.objects.create(
            task=task,
            node=node,
            received_file=name,
            update_hash=digest,
            num_samples=num_samples,
            metrics=metrics,
            compute_s=billed_seconds(metrics, task, timezone.now()),
        )
        enqueue_update_check(task.pk)
    return 202


def billed_seconds(metrics: dict[str, float], task: Task, now: datetime) -> float:
    """Billing input for an update of `task` arriving `now`: the compute seconds its node
    says (`metrics["compute_s"]`), never more than the time it held the lease, nor a lease."""
    held_s = (now - task.leased_at).total_seconds() if task.leased_at else 0.0
    lease_s = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    return min(max(metrics.get("compute_s", 0.0), 0.0), held_s, lease_s)


def check_layout(task: Task, entries: dict[str, Entry], metadata: dict[str, str]) -> None:
    """What the headers alone show of an upload's layout, refused here as the worker's
    decoding would refuse it (the same reasons): a masked input (secure aggregation) is one
    U32 tensor `masked` of the update's length (trainer.secagg.vectors.decode_masked); a
    plain training update (no codec) holds exactly the tensors of the round's model that an
    update carries (trainer.lora.update_part), each of its shape (trainer.updates). Other
    codecs' layouts and scoring results are the worker's to check."""
    spec = task.round.job.parsed_spec
    if spec.scoring:
        return
    secure = spec.privacy.secure_aggregation.enabled
    if not secure and metadata.get("codec", "none") != "none":
        return
    reference = update_part(spec.model, model_header(task.round.input_model_file))
    if secure:
        length = sum(math.prod(e.shape) for e in reference.values())
        masked = entries.get(MASKED_KEY)
        if set(entries) != {MASKED_KEY}:
            problem = f"a masked update holds one tensor named {MASKED_KEY!r}"
        elif masked is not None and (masked.dtype != "U32" or masked.shape != (length,)):
            problem = (f"a masked update is {length} uint32 values, not {masked.dtype} "
                       f"{list(masked.shape)}")  # fmt: skip
        else:
            return
        raise UpdateRejectedError(
            f"The update was rejected: this job uses secure aggregation and takes masked "
            f"updates only; {problem}.", reason="secagg",
        )  # fmt: skip
    for reason, names, says in (
        ("missing_keys", set(reference) - set(entries), "is missing tensor(s)"),
        ("unexpected_keys", set(entries) - set(reference), "has unexpected tensor(s)"),
    ):
        if names:
            shown = ", ".join(repr(n) for n in sorted(names)[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            raise UpdateRejectedError(
                f"The update was rejected: update {says} {shown}{more}.", reason=reason
            )
    for name, ref in reference.items():
        if entries[name].shape != ref.shape:
            raise UpdateRejectedError(
                f"The update was rejected: tensor '{name}' has shape "
                f"{list(entries[name].shape)}, expected {list(ref.shape)}.",
                reason="shape",
            )


def received_name(job_id: object, task_id: object, digest: str) -> str:
    """Where the bytes as sent wait for the worker: named by their task and hash, apart from
    the checked updates (a compressed one is stored decoded under its digest). The task is
    in the name because each check deletes its file: two tasks may send the same bytes (a
    deterministic run on two nodes), and one's check must not take the other's file away."""
    return f"{files.job_dir(job_id)}/received/{task_id}-{digest}.safetensors"


def takes_late(rnd: Round, task: Task) -> bool:
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
        # an upload received but unchecked goes with the lease: a later check finds nothing,
        # and its node reads why (GET agent/tasks/<id>/update: rounds.selectors)
        for received in ReceivedUpdate.objects.filter(task_id=task.pk):
            RefusedUpdate.objects.create(task_id=task.pk, node_id=received.node_id,
                                         update_hash=received.update_hash,
                                         reason=reason[:300])  # fmt: skip
            received.delete()
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
            rnd = Round.objects.select_for_update(no_key=True).get(pk=task.round_id)
            maybe_close(rnd)
    return task
