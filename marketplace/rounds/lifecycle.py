"""Opening rounds and deciding when one closes (quorum or deadline)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import online_nodes
from marketplace.observability import metrics as obs
from marketplace.rounds.models import Round, RoundStatus, Task, TaskResult, TaskStatus
from marketplace.rounds.planning import may_work_on
from marketplace.rounds.queue import enqueue_aggregation
from marketplace.rounds.scheduling import job_needs, node_view, nodes_that_may_work_on
from marketplace.rounds.signals import bump_work_generation
from marketplace.rounds.sizing import is_far, plan_cohort
from trainer import round_lifecycle as rl
from trainer.round_lifecycle import quorum_units  # the rule submission checks too
from trainer.spec import JobSpec

if TYPE_CHECKING:
    from marketplace.jobs.models_io import State


def round_deadline(
    job: Job, now: datetime | None = None, period_s: float | None = None
) -> datetime:
    """When a round opened (or extended) now is due: `period_s` (the round's own, the plan's)
    or the spec's or the default (trainer.round_lifecycle.deadline_s)."""
    seconds = period_s or rl.deadline_s(job.parsed_spec, None, settings.GPUFLEX["ROUND_DEADLINE_S"])
    return (now or timezone.now()) + timedelta(seconds=seconds)


def round_rules(rnd: Round) -> rl.Rules:
    """The rules that close `rnd`: its spec's, with its plan's quorum when it has one."""
    return rl.Rules.for_spec(rnd.job.parsed_spec, plan_quorum=rnd.plan_quorum)


def open_round(
    job: Job, number: int, state: State, *, delta: tuple[str, str] | None = None
) -> Round:
    """Store the round's input model and create one pending task per shard. `delta` is
    (stored payload, base model hash) for delta-delivered jobs: how nodes that hold the
    previous round's model get this one (marketplace.rounds.delivery)."""
    from marketplace.jobs.models_io import store_model
    from marketplace.rounds.resharding import round_shards
    from trainer.steps import derive_seed

    model_hash, model_file = store_model(job, number, state)
    delta_file, delta_base = delta if delta and delta[0] else ("", "")
    plan, plan_deadline_s, plan_quorum = _plan(job)
    period_s = rl.deadline_s(job.parsed_spec, plan_deadline_s, settings.GPUFLEX["ROUND_DEADLINE_S"])
    rnd = Round.objects.create(
        job=job,
        number=number,
        input_model_hash=model_hash,
        input_model_file=model_file,
        input_delta_file=delta_file,
        input_delta_base=delta_base,
        input_delta_size=files.size(delta_file) if delta_file else 0,
        deadline=round_deadline(job, period_s=period_s),
        deadline_s=period_s,
        plan=plan,
        plan_quorum=plan_quorum,
    )
    if job.is_federated:
        reserve_silos(rnd)
    else:
        spec = job.parsed_spec
        # elastic jobs may re-cut their shards here, for the nodes online now
        shards = round_shards(job, number, fewest_shards(spec))
        Task.objects.bulk_create(
            Task(round=rnd, shard=s, replica=0, seed=derive_seed(spec.seed, number, s.index))
            for s in shards
        )
    transaction.on_commit(bump_work_generation)
    job_changed(job.pk)
    obs.round_opened()
    return rnd


def fewest_shards(spec: JobSpec) -> int:
    """The fewest shards whose quorum still brings the updates the strategy needs to
    aggregate a round (the rule submission checks): an elastic job is never re-cut below."""
    from trainer.aggregation import min_updates

    need = min_updates(spec.aggregation)
    count = need
    while quorum_units(spec.rounds.quorum, count) < need:
        count += 1
    return count


def _plan(job: Job) -> tuple[dict[str, Any], float | None, int | None]:
    """Adaptive jobs: the policy plans the round for the nodes online now that may work on
    the job, and its tiers carry over to the next round (the job keeps them). Returns the
    nodes' entries, the plan's deadline (seconds) and its quorum (updates); unplanned: {},
    None, None."""
    if job.is_federated or not job.parsed_spec.adaptation.enabled or not job.input_shape:
        return {}, None, None
    cohort = list(nodes_that_may_work_on(job) & online_nodes())
    if not cohort:
        return {}, None, None  # nobody to plan for: each node is sized as it claims
    planned = plan_cohort(job, cohort)
    job.policy_tiers = planned.tiers
    job.save(update_fields=["policy_tiers", "updated_at"])
    return planned.entries, planned.deadline_s, planned.quorum


def schema_misfit(input_shape: list[int], num_classes: int, schema: dict | None) -> str:
    """Why a silo's advertised schema cannot train a model made for `input_shape` and
    `num_classes` ("" when it can, or when the node declared no schema: a node's own data is
    checked against the model by its task runner too)."""
    if not schema:
        return ""
    shape = schema.get("input_shape")
    if shape is not None and list(shape) != list(input_shape):
        return f"its rows have shape {list(shape)}, the job's model takes {list(input_shape)}"
    classes = schema.get("num_classes")
    if classes is not None and classes != num_classes:
        return f"it has {classes} classes, the job's model {num_classes}"
    return ""


def silo_fits(job: Job, node: Node) -> bool:
    """A node may train a federated job: it holds the dataset and meets price, hardware
    (`may_work_on`) and tier."""
    from marketplace.jobs.models import Tier

    if job.federated_dataset not in (node.local_datasets or []):
        return False
    schema = (node.local_dataset_schemas or {}).get(job.federated_dataset)
    if schema_misfit(job.input_shape, job.num_classes, schema):
        return False
    if not may_work_on(job_needs(job), node_view(node)):
        return False
    if job.tier == Tier.PLATFORM:
        return node.kind == NodeKind.PLATFORM
    return not (job.tier == Tier.VOLUNTEER and node.kind == NodeKind.PLATFORM)


def reserve_silos(rnd: Round) -> int:
    """One task per online node holding the job's local dataset, reserved for that node;
    silos that come online later join while the round is open (the tick calls this)."""
    from trainer.steps import derive_seed

    job = rnd.job
    taken = set(Task.objects.filter(round=rnd).values_list("reserved_for_id", flat=True))
    seed = job.parsed_spec.seed
    silos = [n for n in online_nodes() if n.pk not in taken and silo_fits(job, n)]
    Task.objects.bulk_create(
        Task(round=rnd, reserved_for=n, replica=0, seed=derive_seed(seed, rnd.number, n.pk))
        for n in silos
    )
    if silos:
        transaction.on_commit(bump_work_generation)
    return len(silos)


@dataclass(frozen=True)
class UnitState:
    """Where one (round, shard) stands: the result to aggregate, if it is settled."""

    unit: tuple[int | None, int | None]  # Task.unit
    settled: bool
    result: TaskResult | None  # the accepted result to aggregate (None: nothing usable)
    # nothing in yet, and leased to a far node for two rounds: the round does not wait for it
    far: bool = False
    # leased now, its lease not expired (reclaim_leases ends the rest), or its upload received
    # and waiting for the worker's check
    in_flight: bool = False


def two_round(rnd: Round, task: Task) -> bool:
    """A far node's two-round task: a primary leased to a node the round's plan has syncing
    every other round (trainer.adapt). It trains on past its round's close whatever
    `rounds.late_updates` says, and a later round folds its update in."""
    return task.replica == 0 and task.status == TaskStatus.LEASED and is_far(rnd.plan, task.node_id)


def unit_states(rnd: Round, *, at_deadline: bool = False) -> list[UnitState]:
    """A unit is settled when verification has nothing more to wait for. At the deadline,
    an accepted result whose replica never came back is used unverified."""
    tasks = list(
        Task.objects.filter(round=rnd)
        .select_related("result", "received")
        .order_by("replica", "created_at")
    )
    by_unit: dict[tuple[int | None, int | None], list[Task]] = {}
    for task in tasks:
        by_unit.setdefault(task.unit, []).append(task)
    states = []
    now = timezone.now()
    for unit, group in by_unit.items():
        results = [t.result for t in group if hasattr(t, "result")]
        accepted = [r for r in results if r.accepted]
        outstanding = any(t.status in (TaskStatus.PENDING, TaskStatus.LEASED) for t in group)
        verified = [r for r in accepted if r.verified]
        far = not results and any(two_round(rnd, t) for t in group)
        # an upload received but not yet checked by the worker is in flight whatever its
        # lease's clock says: the node's work is in, it only waits for the check
        in_flight = any(
            t.status == TaskStatus.LEASED
            and (hasattr(t, "received") or (t.lease_expires is not None and t.lease_expires > now))
            for t in group
        )
        # an unverified result is usable only when it is the unit's only one: two that were
        # never reconciled are a dispute, and either of them may be the bad one
        unverified = [r for r in accepted if r.verified is None]
        usable = unverified[0] if len(unverified) == 1 else None
        if verified:
            states.append(UnitState(unit, True, verified[0]))
        elif outstanding:
            states.append(UnitState(unit, at_deadline, usable, far, in_flight))
        else:
            states.append(UnitState(unit, True, usable))
    return states


def lifecycle_units(states: list[UnitState]) -> list[rl.Unit]:
    return [
        rl.Unit(settled=s.settled, usable=s.result is not None, far=s.far, in_flight=s.in_flight)
        for s in states
    ]


def quorum_reached(rnd: Round, states: list[UnitState]) -> bool:
    """trainer.round_lifecycle.quorum_reached over the round's units."""
    return rl.quorum_reached(lifecycle_units(states), round_rules(rnd))


def start_aggregation(rnd: Round) -> None:
    """OPEN -> AGGREGATING (caller holds the round's row lock); the aggregation is enqueued
    once this transaction commits. Work not started is cancelled, and work in flight too but
    for what `kept_in_flight` keeps: a later round folds its update in (FedBuff). A secure-
    aggregation round first asks its survivors for the shares that unmask the sum, and starts
    aggregating once they are in (marketplace.rounds.secagg_replies)."""
    from marketplace.rounds.secagg import hold_for_unmask

    if hold_for_unmask(rnd):
        return
    now = timezone.now()
    rnd.status = RoundStatus.AGGREGATING
    rnd.closed_at = now
    rnd.aggregating_since = now
    rnd.save(update_fields=["status", "closed_at", "aggregating_since"])
    outstanding = Task.objects.filter(round=rnd, status__in=[TaskStatus.PENDING, TaskStatus.LEASED])
    outstanding.exclude(pk__in=kept_in_flight(rnd)).update(status=TaskStatus.CANCELLED)
    enqueue_aggregation(rnd.pk)
    job_changed(rnd.job_id)
    obs.round_closed()


def kept_in_flight(rnd: Round) -> list[Any]:
    """The leased primaries of units with no result yet that train on past the close: all
    of them with `rounds.late_updates: stale`, and a far node's two-round task whatever the
    spec says (its round was never meant to wait for it). A unit that has a result (a
    replica's) already has its update: its primary is not folded in a second time."""
    rules = round_rules(rnd)
    leased = Task.objects.filter(round=rnd, status=TaskStatus.LEASED, replica=0)
    kept = [t for t in leased if rl.keeps_training(rules, far=two_round(rnd, t))]
    if not kept:
        return []
    settled = {t.unit for t in Task.objects.filter(round=rnd, result__isnull=False)}
    return [t.pk for t in kept if t.unit not in settled]


def close_after_far_leases(tasks: list[Task]) -> int:
    """A round whose other units all settled waits for nobody once a far node leases its
    two-round task (`quorum_reached` leaves it out): close it now rather than at the next
    maintenance tick or upload. Returns how many rounds closed."""
    rounds = {t.round_id for t in tasks if t.replica == 0 and is_far(t.round.plan, t.node_id)}
    closed = 0
    for pk in sorted(rounds):
        with transaction.atomic():
            closed += maybe_close(Round.objects.select_for_update(no_key=True).get(pk=pk))
    return closed


def maybe_close(rnd: Round) -> bool:
    """Close the round if quorum is reached; the caller holds the round's row lock."""
    if rnd.status != RoundStatus.OPEN:
        return False
    if quorum_reached(rnd, unit_states(rnd)):
        start_aggregation(rnd)
        return True
    return False
