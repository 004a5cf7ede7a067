"""Proof-of-learning segment checks: cheaper checks for lazy work (issue 35, trainer.proof).

A training upload carries, in its metadata, `boundaries` (step counts 0..steps, JSON) and
`commitments` (the SHA-256 of the task's state at each, trainer.proof_commitment, JSON). Right
after it is stored, `draw_check` draws (the server's own randomness, SEGMENT_CHECK_SHARE of
uploads) whether to check it and which segment j; the node could not know either when it
trained. The node is then asked (GET /api/v1/agent/proofs) to reveal checkpoints 0, j, j+1
and the last (PUT /api/v1/agent/proofs/<id>/checkpoints/<step>), each checked here against
its commitment with no torch (trainer.proof_commitment). Once all are in, the worker re-runs
segment j from checkpoint j (marketplace.proofs.worker) and settles the check. A node that
reveals nothing by the deadline (SEGMENT_REVEAL_S) fails it, as does one whose checkpoint
does not match its commitment.

Settling calls marketplace.nodes.services.record_verification (a failure: the node's trust,
and whatever is hooked on a failed verification) and, on a failure, rejects the result.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.errors import Conflict, MarketplaceError, NotFound
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import on_probation
from marketplace.nodes.services import record_verification
from marketplace.proofs.models import CheckStatus, SegmentCheck
from marketplace.rounds.models import TaskResult
from marketplace.server.routing import RUN_SEGMENT_CHECK
from trainer.proof_commitment import CommitmentError, checkpoint_step, commitment, parse_claim

log = logging.getLogger(__name__)
_draw = random.SystemRandom()  # the server's own randomness: a node cannot predict it


def claimed_chain(
    metadata: Mapping[str, str], steps: int | None
) -> tuple[list[str], list[int]] | None:
    """The upload's claimed chain, checked; None when it carries none (an older agent, a
    task kind without one) or a malformed one: that upload is left to replicas."""
    raw_c, raw_b = metadata.get("commitments"), metadata.get("boundaries")
    if raw_c is None or raw_b is None:
        return None
    try:
        bounds = json.loads(raw_b)
        last = bounds[-1] if isinstance(bounds, list) and bounds else -1
        return parse_claim(json.loads(raw_c), bounds, steps if steps else last)
    except (ValueError, CommitmentError) as exc:
        log.info("an upload's proof of learning is malformed: %s", exc)
        return None


def check_share(node: Node) -> float:
    """The chance one of `node`'s uploads is checked: every one while it is on probation (new,
    or once caught: nodes.selectors.on_probation), SEGMENT_CHECK_SHARE once trusted; a
    platform node is trusted from the start. Nothing with checks off (share 0)."""
    share = settings.GPUFLEX["SEGMENT_CHECK_SHARE"]
    if share <= 0 or node.kind == NodeKind.PLATFORM:
        return share
    return 1.0 if on_probation(node) else share


def after_upload(result: TaskResult, metadata: Mapping[str, str]) -> SegmentCheck | None:
    """A training upload is in: its segment check is drawn, or, where the lease counted on a
    proof that did not come (an agent older than proofs), the replica the proof stood in
    for is made now (rounds.scheduling.proof_stands_in)."""
    from marketplace.rounds.scheduling import add_replica, needs_replica, proof_stands_in

    task = result.task
    if (
        claimed_chain(metadata, task.steps) is None
        and not settings.GPUFLEX["SEGMENT_PROOF_REQUIRED"]
    ):
        spec = task.round.job.parsed_spec
        counted_on = task.replica == 0 and task.shard_id is not None and not result.late
        if counted_on and proof_stands_in(spec, task.codec) and needs_replica(result.node, task):
            add_replica(task, task.steps, task.batch_size, task.codec)
        return None
    return draw_check(result, metadata)


def draw_check(
    result: TaskResult, metadata: Mapping[str, str], rng: random.Random | None = None
) -> SegmentCheck | None:
    """After an upload: whether to check it, and which segment (module docstring)."""
    share = check_share(result.node)
    chain = claimed_chain(metadata, result.task.steps)
    required = settings.GPUFLEX["SEGMENT_PROOF_REQUIRED"]
    if (chain is None and not required) or share <= 0:
        return None
    rng = rng or _draw
    if rng.random() >= share:
        return None
    if chain is None:  # it could have committed and did not: a skipped proof is no escape
        check = SegmentCheck.objects.create(
            result=result, node_id=result.node_id, boundaries=[], commitments=[], segment=0,
            wanted=[], deadline=timezone.now(),
        )  # fmt: skip
        settle(check, False, "the upload carries no proof of learning")
        return check
    commitments, bounds = chain
    j = rng.randrange(len(bounds) - 1)
    wanted = sorted({bounds[0], bounds[j], bounds[j + 1], bounds[-1]})
    return SegmentCheck.objects.create(
        result=result, node_id=result.node_id, boundaries=bounds, commitments=commitments,
        segment=j, wanted=wanted, task_steps=bounds[-1],
        deadline=timezone.now() + timedelta(seconds=settings.GPUFLEX["SEGMENT_REVEAL_S"]),
    )  # fmt: skip


def pending(node: Node) -> list[dict[str, Any]]:
    """What the node is asked to reveal: per check, the task and the steps still missing."""
    out = []
    for check in SegmentCheck.objects.filter(
        node=node, status=CheckStatus.REQUESTED
    ).select_related("result"):
        missing = [s for s in check.wanted if str(s) not in check.revealed]
        out.append({"id": check.pk, "task_id": str(check.result.task_id), "steps": missing,
                    "deadline": check.deadline.isoformat()})  # fmt: skip
    return out


def reveal(node: Node, check_id: int, step: int, body: bytes) -> dict[str, Any]:
    """One revealed checkpoint, checked against its commitment and stored."""
    limit = settings.GPUFLEX["MAX_CHECKPOINT_BYTES"]
    if len(body) > limit:
        raise MarketplaceError(f"The checkpoint is {len(body)} bytes; the limit is {limit}.")
    if not 0 < check_id < 2**63:  # a path's number the database cannot hold names nothing
        raise NotFound("No such segment check for this node.")
    check = SegmentCheck.objects.filter(pk=check_id, node=node).select_related("result").first()
    if check is None:
        raise NotFound("No such segment check for this node.")
    if check.status != CheckStatus.REQUESTED:
        raise Conflict(f"The segment check is {check.status}; it takes no checkpoints.")
    if step not in check.wanted:
        raise MarketplaceError(f"Step {step} is not asked for; reveal steps {check.wanted}.")
    expected = check.commitments[check.boundaries.index(step)]
    try:
        ok = checkpoint_step(body) == step and commitment(body) == expected
    except CommitmentError as exc:
        raise MarketplaceError(f"The checkpoint was rejected: {exc}.") from None
    if not ok:
        settle(check, False, f"checkpoint {step} does not match its commitment")
        return {"status": CheckStatus.FAILED.value}
    name = f"{files.job_dir(check.result.task.round.job_id)}/proofs/{check.pk}/{step}.safetensors"
    files.put(name, body)
    with transaction.atomic():
        check = SegmentCheck.objects.select_for_update(no_key=True).get(pk=check.pk)
        if check.status != CheckStatus.REQUESTED:
            return {"status": check.status}
        check.revealed[str(step)] = name
        if all(str(s) in check.revealed for s in check.wanted):
            check.status = CheckStatus.REVEALED
            pk = check.pk
            transaction.on_commit(lambda: current_app.tasks[RUN_SEGMENT_CHECK].delay(pk))
        check.save(update_fields=["revealed", "status"])
    return {"status": check.status}


def settle(
    check: SegmentCheck, ok: bool, reason: str = "", *, distance: float | None = None,
    tolerance: float | None = None, rerun_steps: int = 0, verifier: str = "",
) -> None:  # fmt: skip
    """The check's verdict, once: the node's verification record, and a failed result
    rejected."""
    with transaction.atomic():
        check = SegmentCheck.objects.select_for_update(no_key=True).get(pk=check.pk)
        if check.status in (CheckStatus.PASSED, CheckStatus.FAILED):
            return
        check.status = CheckStatus.PASSED if ok else CheckStatus.FAILED
        check.reason, check.distance, check.tolerance = reason[:300], distance, tolerance
        check.rerun_steps, check.verifier = rerun_steps, verifier
        check.settled_at = timezone.now()
        check.save()
        if not ok:
            TaskResult.objects.filter(pk=check.result_id).update(
                accepted=False, verified=False, rejection=f"segment check: {reason}"[:200]
            )
        record_verification(check.node_id, ok=int(ok), bad=int(not ok), caught=not ok,
                            reason=f"segment check: {reason}")  # fmt: skip


def skip(check_id: int, reason: str) -> None:
    """No verdict: the verifier could not re-run the segment (worker.run_check)."""
    SegmentCheck.objects.filter(pk=check_id, status=CheckStatus.REVEALED).update(
        status=CheckStatus.SKIPPED, reason=reason[:300], settled_at=timezone.now()
    )


def expire_overdue() -> int:
    """Checks whose node revealed nothing by the deadline fail (the periodic tick)."""
    overdue = SegmentCheck.objects.filter(status=CheckStatus.REQUESTED, deadline__lt=timezone.now())
    count = 0
    for check in overdue:
        settle(check, False, "the checkpoints were not revealed by the deadline")
        count += 1
    return count


def overhead() -> dict[str, float]:
    """Verification compute of the settled checks against the compute they checked (steps)."""
    done = SegmentCheck.objects.filter(status__in=(CheckStatus.PASSED, CheckStatus.FAILED))
    rerun = sum(done.values_list("rerun_steps", flat=True))
    steps = sum(done.values_list("task_steps", flat=True))
    return {"checks": done.count(), "rerun_steps": rerun, "task_steps": steps}
