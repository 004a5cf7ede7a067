"""Closing a round: statistics, aggregation, evaluation, checkpoint, provenance, next round.

Idempotent: the heavy part runs outside any transaction and writes only content-addressed
or per-job files; the checkpoint is written before the database moves on, and a re-run that
finds a checkpoint already at this round reuses it instead of aggregating twice. The final
transaction re-checks the round's status, so a duplicate delivery changes nothing.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.faults import failpoint
from marketplace.jobs import files
from marketplace.jobs.datasets import job_dataset
from marketplace.jobs.models import Job, JobStatus
from marketplace.jobs.models_io import State, load_model_file, new_model, store_model
from marketplace.jobs.privacy import privacy_stop_reason, spent_after
from marketplace.jobs.services import cancel_outstanding, fail_job
from marketplace.jobs.tasks import enqueue_tracking
from marketplace.ledger.anchoring import request_anchor, wants_anchor
from marketplace.ledger.services import (
    budget_stop_reason,
    charge_result,
    release_escrow,
    release_unpaid,
)
from marketplace.ledger.tasks import enqueue_anchor
from marketplace.nodes.models import Node
from marketplace.nodes.services import record_verification
from marketplace.observability import metrics as obs
from marketplace.rounds.lifecycle import open_round, unit_states
from marketplace.rounds.models import Round, RoundStatus, TaskResult
from marketplace.rounds.scheduling import online_candidates
from marketplace.rounds.scoring import finish_scoring
from marketplace.rounds.secagg import secagg_contribution, secagg_label, secure
from marketplace.rounds.weighting import weigh
from marketplace.sweeps.queue import enqueue_sweep
from trainer.aggregation import ClientUpdate, build_strategy
from trainer.artifacts import ArtifactStore
from trainer.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from trainer.delivery import delivery_codec
from trainer.hashing import bytes_hash, state_hash
from trainer.provenance import ProvenanceChain
from trainer.rounds import DEFAULT_MIN_COSINE, checkpoint_after, close_round, staleness_weight
from trainer.schedule import plateau_reason
from trainer.updates import decode_state

log = logging.getLogger(__name__)

# Failures that say nothing about the round itself: storage or the database may be back on
# the next attempt, and the worker may have more memory free. Any other exception while
# aggregating is a property of the round's updates and the job's spec, so it fails the job.
TRANSIENT = (OSError, OperationalError, InterfaceError, MemoryError)


def checkpoint_name(job: Job) -> str:
    return f"{files.job_dir(job.id)}/checkpoint.safetensors"


def provenance_name(job: Job) -> str:
    return files.provenance_name(job.id)


def artifact_store() -> ArtifactStore:
    return ArtifactStore(Path(settings.DATA_DIR) / "artifacts")


def read_checkpoint(job: Job) -> Checkpoint | None:
    from django.core.files.storage import default_storage

    name = checkpoint_name(job)
    if not default_storage.exists(name):
        return None
    with files.local_copy(name, ".safetensors") as path:
        return load_checkpoint(path)


def write_checkpoint(job: Job, ckpt: Checkpoint) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuflex-ckpt-") as tmp:
        path = Path(tmp) / "checkpoint.safetensors"
        save_checkpoint(path, ckpt)
        files.put(checkpoint_name(job), path.read_bytes())


@dataclass
class Outcome:
    state: State
    metrics: dict[str, Any]
    reached_target: bool
    used: list[int]  # TaskResult ids aggregated, in order
    dropped: dict[int, float]  # TaskResult id -> cosine, rejected by statistics
    cosines: dict[int, float]  # TaskResult id -> cosine to the round's median update
    delta_file: str = ""  # delta-delivered jobs: the payload from this round's model to `state`
    # the job's held-out metric has plateaued (rounds.early_stopping): why it stops now
    plateau: str = ""


def _plateau(job: Job, history: list[dict[str, Any]]) -> str:
    rule = job.parsed_spec.rounds.early_stopping
    if rule is None:
        return ""
    return plateau_reason([float(h[rule.metric]) for h in history], rule)


def delta_name(job: Job, state: State) -> str:
    """Where the delta that leads to `state` is kept: named by the model it leads to, so a
    re-run that reuses its checkpoint finds it again."""
    return f"{files.job_dir(job.id)}/deltas/{state_hash(state)}.safetensors"


def _stored_delta(job: Job, state: State) -> str:
    from django.core.files.storage import default_storage

    name = delta_name(job, state)
    return name if default_storage.exists(name) else ""


def _min_cosine() -> float:
    conf = settings.GPUFLEX["MIN_COSINE"]
    return DEFAULT_MIN_COSINE if conf is None else float(conf)


def _order(result: TaskResult) -> tuple[int, int]:
    """Shard order (silos by node id): the order provenance replays the aggregation in."""
    shard = result.task.shard
    return (0, shard.index) if shard else (1, result.node_id)


def _late_results(job: Job, rnd: Round) -> list[TaskResult]:
    """Updates that arrived after their round closed and no round has folded in yet."""
    late = TaskResult.objects.filter(
        task__round__job=job, task__round__number__lt=rnd.number, late=True, accepted=True,
        aggregated=False,
    ).select_related("task__round", "task__shard")  # fmt: skip
    return sorted(late, key=lambda r: (r.task.round.number, *_order(r)))


def _delta(result: TaskResult, rnd: Round) -> State:
    """The stored update; one trained on an older model (folded late) weighs less."""
    delta = decode_state(files.get(result.update_file))[0]
    staleness = rnd.number - result.task.round.number
    if staleness <= 0:
        return delta
    weight = staleness_weight(staleness)
    return {k: v * weight for k, v in delta.items()}


def _shard_label(job: Job, result: TaskResult) -> str:
    shard = result.task.shard
    return shard.content_hash if shard else f"local:{job.federated_dataset}:{result.node_id}"


def contribution_groups(results: list[TaskResult]) -> list[list[TaskResult]]:
    """The results as the strategy sees them: each flat result alone, and each zone
    partial's members together, at its first member's place (a partial counts once). A
    partial some of whose members are not here (one was cancelled since) cannot be split,
    so none of them is."""
    groups: list[list[TaskResult]] = []
    partials: dict[int, list[TaskResult]] = {}
    for result in results:
        if result.partial_id is None:
            groups.append([result])
        elif result.partial_id not in partials:
            partials[result.partial_id] = [result]
            groups.append(partials[result.partial_id])
        else:
            partials[result.partial_id].append(result)
    complete = {
        pid for pid, members in partials.items()
        if len(members) == len(members[0].partial.manifest)
    }  # fmt: skip
    for pid in partials.keys() - complete:
        log.warning("zone partial %s is incomplete in this round: not aggregated", pid)
    return [g for g in groups if g[0].partial_id is None or g[0].partial_id in complete]


def _contribution(job: Job, rnd: Round, group: list[TaskResult]) -> tuple[ClientUpdate, str]:
    """(update, shard label) for provenance: a zone partial is one contribution, named by
    its aggregator, whose members provenance lists (trainer.provenance.Contribution)."""
    first = group[0]
    if first.partial_id is None:
        update = ClientUpdate(str(first.node_id), _delta(first, rnd), first.num_samples,
                              first.metrics)  # fmt: skip
        return update, _shard_label(job, first)
    partial = first.partial
    mean = decode_state(files.get(partial.update_file))[0]
    label = bytes_hash("\n".join(sorted(m["shard_hash"] for m in partial.manifest)).encode())
    node = f"zone:{partial.zone}:{partial.aggregator_id}"
    return ClientUpdate(node, mean, partial.num_samples, {}, tuple(partial.manifest)), label


def _compute(job: Job, rnd: Round) -> Outcome:
    spec = job.parsed_spec
    previous = read_checkpoint(job)
    if previous is not None and previous.round >= rnd.number:
        # an earlier attempt got as far as the checkpoint: reuse it, do not aggregate twice
        last = previous.history[-1]
        return Outcome(
            previous.model_state,
            last,
            bool(previous.extra.get("reached_target")),
            last.get("used", []),
            {},
            {},
            _stored_delta(job, previous.model_state),
            _plateau(job, previous.history),
        )
    global_state = load_model_file(rnd.input_model_file)
    results = [s.result for s in unit_states(rnd, at_deadline=True) if s.result is not None]
    results.sort(key=_order)
    late = _late_results(job, rnd)
    strategy = build_strategy(spec.aggregation)
    chain = ProvenanceChain(str(job.id))
    history: list[dict[str, Any]] = []
    if previous is not None:
        strategy.load_state_dict(previous.strategy_state)
        chain = ProvenanceChain.from_json(previous.extra["provenance"])
        history = list(previous.history)
    # one update per flat result, one per zone partial (its members' weighted mean)
    groups = contribution_groups(results + late)
    if secure(job):  # one update: the survivors' masked inputs, summed and unmasked
        groups = [results]
        contributions = [(secagg_contribution(job, rnd, results), secagg_label(job, results))]
    else:
        contributions = [_contribution(job, rnd, g) for g in groups]
    updates, weighting = weigh(job, rnd, contributions)
    closed = close_round(
        number=rnd.number, global_state=global_state, updates=updates, strategy=strategy,
        model=new_model(job), dataset=job_dataset(job), chain=chain, store=artifact_store(),
        target=spec.rounds.target, min_cosine=_min_cosine(),
        delivery=delivery_codec(spec), residual=previous.residual if previous else None,
    )  # fmt: skip
    delta_file = ""
    if closed.delta is not None:  # before the checkpoint: a re-run that reuses it finds this
        delta_file = files.put(delta_name(job, closed.state), closed.delta, content_addressed=True)
    ev, kept = closed.evaluation, [r for i in closed.kept for r in groups[i]]
    results += late
    metrics = {
        "round": rnd.number,
        "accuracy": ev.accuracy,
        "correct": ev.correct,
        "total": ev.total,
        "loss": ev.loss,
        "participants": len(kept),
        "late_folded": sum(r.late for r in kept),
        "rejected": len(closed.dropped),
        "used": [r.pk for r in kept],
        **weighting,
    }
    history.append(metrics)
    write_checkpoint(
        job,
        checkpoint_after(
            closed, number=rnd.number, spec=job.spec, strategy=strategy, chain=chain,
            history=history, seed=spec.seed,
        ),
    )  # fmt: skip
    files.put(provenance_name(job), chain.to_json().encode())
    dropped = {r.pk: c for i, c in closed.dropped.items() for r in groups[i]}
    cosines = {r.pk: c for i, c in closed.cosines.items() for r in groups[i]}
    return Outcome(closed.state, metrics, closed.reached_target, [r.pk for r in kept], dropped,
                   cosines, delta_file, _plateau(job, history))  # fmt: skip


def round_record_hash(job: Job, number: int) -> str:
    """Round `number`'s provenance record hash, from the record this aggregation wrote."""
    chain = ProvenanceChain.from_json(files.get(provenance_name(job)).decode())
    for record in chain.records:
        if record.round == number:
            return record.record_hash
    raise ValueError(f"job {job.pk} has no provenance record for round {number}")


def run_aggregation(round_id: int) -> None:
    rnd = Round.objects.select_related("job").filter(pk=round_id).first()
    if rnd is None or rnd.status != RoundStatus.AGGREGATING:
        return
    job = rnd.job
    if job.parsed_spec.scoring:
        _finish_scoring(rnd)
        return
    started = time.time()
    try:
        outcome = _compute(job, rnd)
    except TRANSIENT:
        raise  # Celery retries OSError; the tick re-enqueues the rest, a bounded number of times
    except Exception as exc:
        # the same updates and spec would fail the same way on every retry: end the job
        log.exception("job %s round %s cannot be aggregated", job.pk, rnd.number)
        detail = str(exc) or type(exc).__name__
        fail_aggregation(round_id, f"Round {rnd.number} could not be aggregated: {detail}")
        return
    # when and how long: the round-phase bench (bench/rounds_bench.py) splits a round's wall
    # time into queue wait, aggregation and the next round's opening with these
    outcome.metrics |= {"aggregation_started_at": started, "aggregation_s": time.time() - started}
    failpoint("aggregation.before_commit")  # the checkpoint is written, the database not yet
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).select_related("job").get(pk=round_id)
        if rnd.status != RoundStatus.AGGREGATING:
            return  # a duplicate delivery finished first
        job = Job.objects.select_for_update(no_key=True).get(pk=rnd.job_id)
        _settle_results(rnd, outcome)
        rnd.status = RoundStatus.DONE
        rnd.metrics = {k: v for k, v in outcome.metrics.items() if k != "used"}
        rnd.save(update_fields=["status", "metrics"])
        obs.round_finished("done", rnd.opened_at)
        obs.aggregation_took(outcome.metrics["aggregation_s"])
        job.rounds_done = rnd.number
        job.reached_target = outcome.reached_target
        job.privacy_epsilon_spent = spent_after(job, rnd.number)
        model_hash, model_file = store_model(job, rnd.number + 1, outcome.state)
        job.model_hash, job.model_file = model_hash, model_file
        fields = ["rounds_done", "reached_target", "model_hash", "model_file", "updated_at",
                  "privacy_epsilon_spent"]  # fmt: skip
        finished = completion_reason(job, rnd, outcome)
        candidates = partial(online_candidates, job)
        stop = (
            "" if finished or not job.is_active
            else privacy_stop_reason(job) or budget_stop_reason(job, candidates)
        )  # fmt: skip
        if finished and job.status != JobStatus.CANCELLED:
            job.status, job.stop_reason = JobStatus.COMPLETED, finished
            job.finished_at = timezone.now()
            fields += ["status", "stop_reason", "finished_at"]
        elif stop:
            job.status, job.error, job.finished_at = JobStatus.STOPPED, stop, timezone.now()
            job.stop_reason = stop
            fields += ["status", "error", "stop_reason", "finished_at"]
        job.save(update_fields=fields)
        head = job.status == JobStatus.COMPLETED
        if wants_anchor(job, head=head):  # sent on commit, exactly once (ledger/anchoring.py)
            enqueue_anchor(
                request_anchor(job, rnd.number, round_record_hash(job, rnd.number), head=head)
            )
        if job.is_active:
            open_round(job, rnd.number + 1, outcome.state,
                       delta=(outcome.delta_file, rnd.input_model_hash))  # fmt: skip
        else:
            cancel_outstanding(job)
            release_escrow(job)
        enqueue_tracking(job, rnd.number)  # sent on commit; a tracker never fails the round
        if job.parent_id:  # a sweep's trial: its sweep records the round, may prune it
            enqueue_sweep(job.parent_id, job.pk, rnd.number)
        job_changed(job.pk)  # the round's close, pushed to the job page (and the SDK)
    log.info("job %s round %s: %s", job.pk, rnd.number, rnd.metrics)


def completion_reason(job: Job, rnd: Round, outcome: Outcome) -> str:
    """Why the job completes with this round ("" when it goes on): its target, a plateau
    (early stopping) or its last round."""
    target = job.parsed_spec.rounds.target
    if outcome.reached_target and target is not None:
        value = outcome.metrics.get(target.metric)
        shown = f" ({value:.4f})" if isinstance(value, float) else ""
        return f"target reached: {target.metric}{shown} met {target.value:g} at round {rnd.number}"
    if outcome.plateau:
        return f"{outcome.plateau}, at round {rnd.number}"
    if rnd.number >= job.max_rounds:
        return f"all {job.max_rounds} rounds run (rounds.max_rounds)"
    return ""


def _finish_scoring(rnd: Round) -> None:
    """An evaluate or inference job's one round: its results combined (rounds.scoring)."""
    try:
        finish_scoring(rnd.pk)
    except TRANSIENT:
        raise
    except Exception as exc:
        log.exception("job %s: its %s results cannot be combined", rnd.job_id, rnd.job.kind)
        fail_aggregation(rnd.pk, f"The {rnd.job.kind} results could not be combined: {exc}")


def fail_aggregation(round_id: int, reason: str) -> None:
    """Give up on a round that cannot be aggregated: its verified work is paid, the round is
    cancelled (so nothing enqueues it again) and the job fails with `reason` as its error,
    releasing the unspent escrow."""
    error = f"{reason.rstrip('.')}. The job has ended; its unspent budget was returned."
    with transaction.atomic():
        rnd = Round.objects.select_for_update(no_key=True).select_related("job").get(pk=round_id)
        if rnd.status != RoundStatus.AGGREGATING:
            return  # another attempt finished or failed it first
        job = Job.objects.select_for_update(no_key=True).get(pk=rnd.job_id)
        _pay_verified(rnd)
        rnd.status = RoundStatus.CANCELLED
        rnd.metrics = {"round": rnd.number, "error": error}
        rnd.save(update_fields=["status", "metrics"])
        obs.round_finished("cancelled", rnd.opened_at)
        fail_job(job, error)
    log.warning("job %s failed at round %s: %s", job.pk, rnd.number, error)


def _pay_verified(rnd: Round) -> None:
    """Work that replicas confirmed is paid even though no model came of it: the nodes did
    it right, the round failed for reasons of its own (as when a buyer cancels)."""
    results = TaskResult.objects.filter(task__round=rnd, accepted=True, verified=True)
    for result in results.select_related("task__round__job", "node"):
        result.credited = True
        result.save(update_fields=["credited"])
        charge_result(result)


def _settle_results(rnd: Round, outcome: Outcome) -> None:
    used = set(outcome.used)
    folded = Q(pk__in=used) | Q(pk__in=list(outcome.dropped))  # late ones from older rounds
    results = TaskResult.objects.filter(Q(task__round=rnd) | folded)
    # the nodes' rows locked first, in id order, before any ledger account: settling a result
    # writes its node's row (its observed speed) and then the owner's accounts, and two
    # rounds settling at once (a sweep's parallel trials on the same nodes) that took those
    # in different orders deadlocked (seen in CI)
    nodes = Node.objects.filter(pk__in=results.values("node_id")).order_by("pk")
    list(nodes.select_for_update(no_key=True).values_list("pk", flat=True))
    for result in results.select_related("task__round__job", "node").order_by("node_id", "pk"):
        result.cosine = outcome.cosines.get(result.pk, result.cosine)
        if result.pk in outcome.dropped:
            record_verification(result.node_id, bad=1)
            result.accepted = False
            result.cosine = outcome.dropped[result.pk]
            result.rejection = "statistical check: update points away from the others"
        result.aggregated = result.pk in used
        result.credited = result.aggregated or (result.accepted and result.verified is True)
        result.save(update_fields=["accepted", "cosine", "rejection", "aggregated", "credited"])
        if result.credited:
            charge_result(result)
        else:
            release_unpaid(result)


def final_model_bytes(job: Job) -> bytes:
    return files.get(job.model_file)


def model_state_hash(data: bytes) -> str:
    return state_hash(decode_state(data)[0])
