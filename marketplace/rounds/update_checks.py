"""The worker's check of a received upload (rounds.uploads took it in without torch): decoded
against the round's model, then accepted as the request used to accept it (a TaskResult, the
task DONE, the reservation shrunk, verification, the round perhaps closed), or refused: the
task is released as a refused upload's lease always ended, and the reason kept on it."""

from __future__ import annotations

from django.db import transaction

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, UpdateRejectedError
from marketplace.ledger.reservations import shrink_on_upload
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.rounds.delivery import record_model
from marketplace.rounds.lifecycle import maybe_close
from marketplace.rounds.models import (
    ReceivedUpdate,
    Round,
    RoundStatus,
    Task,
    TaskResult,
    TaskStatus,
)
from marketplace.rounds.uploads import release_task, takes_late
from trainer.lora import update_part


def check_received(task_id: object) -> None:
    """Check the task's received upload, if it still has one (a redelivered message finds
    none: the first delivery checked it)."""
    received = (
        ReceivedUpdate.objects.select_related("task__round__job", "task__shard", "node")
        .filter(task_id=task_id)
        .first()
    )
    if received is not None:
        check(received)


def check(received: ReceivedUpdate) -> None:
    """Check `received`, read before the check began. Idempotent: two checks of one upload
    (a message redelivered, or enqueued again by the tick, while the first still runs) both
    decode it, but only the one that finds the row still there under the task's lock
    accepts or refuses it; the other changes nothing."""
    try:
        outcome = _accept(received)
    except MarketplaceError as exc:  # refused: as the request's 409/422 used to refuse it
        _refuse(received, exc)
        return
    except OSError:
        if not ReceivedUpdate.objects.filter(pk=received.pk).exists():
            return  # another check ended it meanwhile, and deleted its file
        raise  # storage failing: the Celery task retries
    if outcome is None:  # another check ended it first
        return
    result, meta = outcome
    files.delete_tree([received.received_file])
    job = result.task.round.job
    spec = job.parsed_spec
    from marketplace.rounds.secagg import secure

    if not spec.scoring and not secure(job):
        # drawn after the upload is in: the node could not know (marketplace/proofs)
        from marketplace.proofs.services import after_upload

        after_upload(result, meta)


def _still_received(received: ReceivedUpdate) -> bool:
    """Under the task's row lock: every path that ends a received upload (a check, a lease
    released) holds that lock, so a row still there is this check's to end."""
    return ReceivedUpdate.objects.filter(pk=received.pk).exists()


def _accept(received: ReceivedUpdate) -> tuple[TaskResult, dict[str, str]] | None:
    from marketplace.rounds.scoring import check_result
    from marketplace.rounds.secagg import check_masked, secure
    from marketplace.rounds.verification import verify_unit
    from trainer.replicas import claimed_device, claimed_precision
    from trainer.updates import UpdateRejected

    task, node = received.task, received.node
    body = files.get(received.received_file)
    digest = received.update_hash
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
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).get(pk=task.round_id)
        task = Task.objects.select_for_update(no_key=True).get(pk=task.pk)
        if not _still_received(received):
            return None
        if task.node_id != node.pk:
            raise Conflict("The task is no longer leased to this node.")
        late = rnd.status != RoundStatus.OPEN
        if task.status != TaskStatus.LEASED or (late and not takes_late(rnd, task)):
            raise Conflict(f"The task is {task.status}; it no longer takes updates.")
        result = TaskResult.objects.create(
            task=task,
            node=node,
            update_file=name,
            update_hash=digest,
            num_samples=received.num_samples,
            precision=precision,
            device=device,
            metrics=received.metrics,
            compute_s=received.compute_s,
            late=late,
        )
        received.delete()
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
    return result, meta


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
    if (problem := noise_problem(delta, spec.privacy)) is not None:  # counted by _refuse
        raise UpdateRejectedError(f"The update was rejected: {problem}.", reason="privacy")
    # Stored decoded, so verification and aggregation read plain deltas whatever the codec;
    # the name keys the bytes the node sent, which is what makes a retried upload idempotent.
    plain = meta.get("codec", "none") == "none"
    files.put(name, body if plain else encode_state(delta), content_addressed=True)
    return precision, device, dict(meta)


def _refuse(received: ReceivedUpdate, exc: MarketplaceError) -> None:
    """The upload is refused: the lease ends as a refused upload's always ended (it was
    reclaimed as lost once it expired, the node having moved on), only now, with the reason
    on the task for the buyer and in a RefusedUpdate for the agent (release_task writes it);
    the round may close without it."""
    reason = exc.extra.get("reason", exc.code)
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).get(pk=received.task.round_id)
        task = Task.objects.select_for_update(no_key=True).get(pk=received.task_id)
        if not _still_received(received):
            # another check ended it first, or its lease went: nothing to count, and its
            # file left alone (the same node may have sent the same bytes for the task
            # again, into the same name; job retention removes what is left)
            return
        if task.node_id == received.node_id and task.status == TaskStatus.LEASED:
            if reason == "privacy":  # too little noise: a bad update, once per upload
                record_verification(received.node_id, bad=1)
            release_task(task, f"upload refused ({reason}): {exc.detail}", lost=True)
            maybe_close(rnd)
        else:  # cannot happen while release_task deletes it with the lease; kept safe
            ReceivedUpdate.objects.filter(pk=received.pk).delete()
    files.delete_tree([received.received_file])
