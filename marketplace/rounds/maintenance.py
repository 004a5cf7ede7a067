"""The periodic tick: reclaim lost work, close overdue rounds, unstick the pipeline.

Everything the server promises after a crash hangs off this: leases of silent nodes and
expired leases go back to the queue, rounds past their deadline close with what they
have, aggregations whose worker died are enqueued again (a bounded number of times: then
the job fails), received uploads whose check message was lost are checked again, and
running jobs without a round in flight (a crash between checkpoint and next round) continue
from their checkpoint.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs.models import Job, JobStatus
from marketplace.jobs.preparation import enqueue_preparation
from marketplace.ledger.anchoring import request_anchor, wants_anchor
from marketplace.ledger.reservations import unaffordable
from marketplace.ledger.services import release_escrow
from marketplace.ledger.tasks import enqueue_anchor
from marketplace.nodes.services import mark_offline
from marketplace.observability import metrics as obs
from marketplace.rounds.aggregation import round_record_hash
from marketplace.rounds.lifecycle import (
    lifecycle_units,
    open_round,
    reserve_silos,
    round_deadline,
    round_rules,
    start_aggregation,
    two_round,
    unit_states,
)
from marketplace.rounds.models import ReceivedUpdate, Round, RoundStatus, Task, TaskStatus
from marketplace.rounds.queue import (
    enqueue_aggregation,
    enqueue_update_check,
    send_checks_again,
)
from marketplace.rounds.retention import prune_ended_jobs
from marketplace.rounds.scheduling import online_candidates
from marketplace.rounds.secagg import stall_reason
from marketplace.rounds.sizing import plan_key
from marketplace.rounds.uploads import release_task
from marketplace.rounds.zones import recheck_partials, release_orphans
from marketplace.uploads.services import expire_stale_uploads
from trainer import round_lifecycle as rl

# Re-enqueued aggregations of one round before its job fails: a crashed worker or a passing
# storage or database error gets several chances, a failure that repeats does not loop.
MAX_AGGREGATION_RESTARTS = 5


def reclaim_leases() -> int:
    """Leases of nodes gone offline and leases past their expiry return to the queue."""
    now = timezone.now()
    offline = mark_offline(now)
    # a task whose update its node handed to a zone aggregator waits for the aggregator,
    # not for the node (rounds.zones): its node going silent loses nothing
    lost = Task.objects.filter(status=TaskStatus.LEASED, zone_aggregator__isnull=True).filter(
        node_id__in=offline
    ) | Task.objects.filter(status=TaskStatus.LEASED, lease_expires__lt=now)
    # an upload received and waiting for the worker's check is not lost: the check ends it;
    # one waiting longer than a lease (its message lost with a broker) is, or nothing would
    checking = now - timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"])
    lost = lost.exclude(received__received_at__gte=checking)
    count = 0
    for task in lost.distinct():
        with transaction.atomic():
            # an expired hand-off is the aggregator's failure, not the member's
            lost_here = task.zone_aggregator_id is None
            release_task(task, "lease lost: node silent or lease expired", lost=lost_here)
            count += 1
    return count + release_orphans()


def close_overdue_rounds() -> int:
    """Rounds past their deadline: trainer.round_lifecycle.at_deadline decides. They close
    with the updates they have when the strategy can aggregate that many (a scoring round:
    with every unit); otherwise they wait one more deadline for the work still out, and
    after MAX_DEADLINES the job fails saying why: no round waits forever."""
    closed = 0
    overdue = Round.objects.filter(
        status=RoundStatus.OPEN, deadline__lt=timezone.now(), job__status=JobStatus.RUNNING
    ).values_list("pk", flat=True)
    for round_id in overdue:
        with transaction.atomic():
            rnd = (
                Round.objects.select_for_update(no_key=True).select_related("job").get(pk=round_id)
            )
            if rnd.status != RoundStatus.OPEN:
                continue
            if stall := stall_reason(rnd):  # a secure round that can never be unmasked
                give_up_secure_round(rnd, stall)
                continue
            rules = round_rules(rnd)
            units = lifecycle_units(unit_states(rnd, at_deadline=True))
            rnd.deadlines_passed += 1
            verdict = rl.at_deadline(units, rules, rnd.deadlines_passed)
            if verdict is rl.Verdict.CLOSE:
                rnd.save(update_fields=["deadlines_passed"])
                start_aggregation(rnd)
                closed += 1
            elif verdict is rl.Verdict.GIVE_UP:
                usable = sum(u.usable for u in units)
                give_up_round(rnd, rl.gave_up_reason(rnd.number, usable, rules))
            else:  # and anyone may take the work now: nobody the plan sat out is kept out
                rnd.deadline = round_deadline(rnd.job, period_s=_extension_s(rnd))
                if not rnd.job.parsed_spec.scoring:
                    rnd.plan = _far_work_out(rnd)
                rnd.save(update_fields=["deadline", "plan", "deadlines_passed"])
    return closed


def _extension_s(rnd: Round) -> float:
    """One more deadline for `rnd`, never shorter than this server takes to notice a lost
    node (its node timeout, then the next tick)."""
    g = settings.GPUFLEX
    period = rnd.deadline_s or rl.deadline_s(rnd.job.parsed_spec, None, g["ROUND_DEADLINE_S"])
    return rl.extension_s(period, g["NODE_TIMEOUT_S"] + g["TICK_S"])


def give_up_secure_round(rnd: Round, reason: str) -> None:
    """End a job whose secure round cannot be unmasked (the caller holds the round's lock)."""
    give_up_round(rnd, reason)


def give_up_round(rnd: Round, reason: str) -> None:
    """End a job whose round cannot close (the caller holds the round's lock): the round is
    cancelled, the job fails saying why, its unspent escrow goes back."""
    from marketplace.jobs.services import cancel_outstanding, fail_job

    job = Job.objects.select_for_update(no_key=True).get(pk=rnd.job_id)
    rnd.status = RoundStatus.CANCELLED
    rnd.closed_at = timezone.now()
    rnd.metrics = {"round": rnd.number, "error": reason}
    rnd.save(update_fields=["status", "closed_at", "metrics"])
    obs.round_finished("cancelled", rnd.opened_at)
    fail_job(job, reason)
    cancel_outstanding(job)
    job_changed(job.pk)


def _far_work_out(rnd: Round) -> dict[str, Any]:
    """What a stalled round keeps of its plan: only the entries of far nodes holding a
    two-round task, which still says that task trains on past the close (and its upload is
    taken then); the rest goes, so that every node may take the work and is sized anew."""
    leased = Task.objects.filter(round=rnd, status=TaskStatus.LEASED, replica=0)
    keys = {plan_key(t.node_id) for t in leased if two_round(rnd, t)}
    return {key: entry for key, entry in rnd.plan.items() if key in keys}


def restart_stuck_aggregations() -> int:
    """Aggregations whose worker died or kept failing are enqueued again, up to
    MAX_AGGREGATION_RESTARTS times; after that the job fails rather than loop forever."""
    from marketplace.rounds.aggregation import fail_aggregation

    cutoff = timezone.now() - timedelta(seconds=settings.GPUFLEX["STUCK_AGGREGATION_S"])
    stuck = list(
        Round.objects.filter(
            status=RoundStatus.AGGREGATING, aggregating_since__lt=cutoff
        ).values_list("pk", "number", "aggregation_restarts")
    )
    restarted = 0
    for round_id, number, restarts in stuck:
        if restarts >= MAX_AGGREGATION_RESTARTS:
            fail_aggregation(
                round_id,
                f"Round {number} did not finish aggregating in {restarts + 1} attempts "
                "(the worker crashed, or storage or the database kept failing)",
            )
            continue
        Round.objects.filter(pk=round_id).update(
            aggregating_since=timezone.now(), aggregation_restarts=F("aggregation_restarts") + 1
        )
        enqueue_aggregation(round_id)
        restarted += 1
    return restarted


def recheck_received_updates() -> int:
    """Received uploads whose check message was lost are checked again
    (rounds.queue.send_checks_again); otherwise reclaim_leases would release the task as
    lost (the node's fault) after a lease's time. Two checks of one upload end it once
    (rounds.update_checks.check)."""
    return send_checks_again(ReceivedUpdate.objects.all(), "task_id", enqueue_update_check)


def resume_orphaned_jobs() -> int:
    """Running jobs with no round open or aggregating continue from their checkpoint."""
    from marketplace.jobs.models_io import load_model_file
    from marketplace.rounds.aggregation import read_checkpoint

    active = Round.objects.filter(
        job=OuterRef("pk"), status__in=[RoundStatus.OPEN, RoundStatus.AGGREGATING]
    )
    resumed = 0
    for job in Job.objects.filter(status=JobStatus.RUNNING).exclude(Exists(active)):
        with transaction.atomic():
            job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
            if Round.objects.filter(
                job=job, status__in=[RoundStatus.OPEN, RoundStatus.AGGREGATING]
            ).exists():
                continue
            ckpt = read_checkpoint(job)
            if ckpt is not None:
                number, state = ckpt.round + 1, ckpt.model_state
            elif not Round.objects.filter(job=job).exists():
                # submitted, its model not built yet (jobs/preparation.py): a preparation
                # message lost with its worker or broker is sent again after a while
                age = (timezone.now() - job.created_at).total_seconds()
                if age > settings.GPUFLEX["STUCK_AGGREGATION_S"]:
                    enqueue_preparation(job.pk)
                continue
            else:
                first = Round.objects.get(job=job, number=1)
                number, state = 1, load_model_file(first.input_model_file)
            if number > job.max_rounds or (ckpt and ckpt.extra.get("reached_target")):
                job.status = JobStatus.COMPLETED
                job.finished_at = timezone.now()
                job.save(update_fields=["status", "finished_at", "updated_at"])
                job_changed(job.pk)
                if ckpt is not None and wants_anchor(job, head=True):
                    digest = round_record_hash(job, ckpt.round)
                    enqueue_anchor(request_anchor(job, ckpt.round, digest, head=True))
                release_escrow(job)
                continue
            open_round(job, number, state)
            resumed += 1
    return resumed


def reserve_new_silos() -> int:
    """Federated rounds take in silos that came online after the round opened."""
    added = 0
    rounds = Round.objects.filter(status=RoundStatus.OPEN, job__status=JobStatus.RUNNING).exclude(
        job__federated_dataset=""
    )
    for rnd in rounds.select_related("job"):
        with transaction.atomic():
            added += reserve_silos(rnd)
    return added


def stop_unaffordable_jobs() -> int:
    """Running jobs whose open round waits for work their free escrow cannot reserve, with
    nothing in flight that could free more, stop now and say why (ledger.reservations):
    otherwise their round would sit out its deadline and stop only then."""
    from marketplace.jobs.services import stop_job

    waiting = Task.objects.filter(round__job=OuterRef("pk"), status=TaskStatus.PENDING,
                                  round__status=RoundStatus.OPEN)  # fmt: skip
    stopped = 0
    for job in Job.objects.filter(status=JobStatus.RUNNING).filter(Exists(waiting)):
        # judged first without the job's lock: a running job nearly always has work in
        # flight, and a claim's commit waits on a lock held on its job's row (its
        # reservations' foreign key), so every tick held up every claim of every job
        if not unaffordable(job.pk, partial(online_candidates, job)):
            continue
        with transaction.atomic():
            job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
            running = job.status == JobStatus.RUNNING
            why = unaffordable(job.pk, partial(online_candidates, job)) if running else ""
            if why:
                stop_job(job, f"Stopped in round {job.rounds_done + 1}: {why}. Raise the "
                              "budget to train further.")  # fmt: skip
                stopped += 1
    return stopped


def tick() -> dict[str, Any]:
    return {
        "silos": reserve_new_silos(),
        # before reclaiming: a dropped partial's members are released with its reason
        "partials": recheck_partials(),
        "reclaimed": reclaim_leases(),
        "unaffordable": stop_unaffordable_jobs(),
        "closed": close_overdue_rounds(),
        "restarted": restart_stuck_aggregations(),
        "rechecked": recheck_received_updates(),
        "resumed": resume_orphaned_jobs(),
        "pruned": prune_ended_jobs(),
        "uploads": expire_stale_uploads(),
        "segment_checks": _expire_segment_checks(),
    }


def _expire_segment_checks() -> int:
    from marketplace.proofs.services import expire_overdue

    return expire_overdue()
