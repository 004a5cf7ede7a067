"""Claiming work: which pending task a node may take, leased atomically, and the long poll.

No task is ever leased twice: on PostgreSQL candidate rows are locked with
`SELECT ... FOR UPDATE SKIP LOCKED`, so concurrent claimers each get a different row
without waiting; on every backend (SQLite ignores FOR UPDATE) the lease itself is a
compare-and-set `UPDATE ... WHERE status = 'pending'` whose row count says who won.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs.models import Job, JobStatus, Shard, Tier
from marketplace.ledger.reservations import Funds, reserve_all
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import on_probation, online_nodes, speed_of
from marketplace.observability import metrics as obs
from marketplace.rounds.claim_read import node_and_open_rounds
from marketplace.rounds.delivery import model_source, record_model
from marketplace.rounds.models import Round, RoundStatus, ShardCopy, Task, TaskStatus
from marketplace.rounds.planning import (
    JobNeeds,
    NodeView,
    PlanRules,
    TaskView,
    may_work_on,
    plan_assignments,
)
from marketplace.rounds.signals import bump_work_generation, work_generation
from marketplace.rounds.sizing import is_far, plan_key, plan_works, planned_work, size_work
from marketplace.server.prepared import array_literal, constant, prepared_cursor
from trainer.proof_commitment import provable
from trainer.schedule import round_lr

if TYPE_CHECKING:
    from trainer.spec import JobSpec

# re-check the database at least this often even when no new-work signal came
_FALLBACK_POLL_S = 2.0


# Oldest round first, then shard order: rounds ids grow with time, and the partial index
# task_pending_order serves exactly this order, so a claim reads a few index entries
# instead of sorting every pending task.
CLAIM_ORDER = ("replica", "round_id", "shard_id")


def node_view(node: Node) -> NodeView:
    """What the scheduling rule reads of a node: its price and hardware as registered, and its
    one speed figure (nodes.selectors.speed_of: a column, no query) for `min_fp32_tflops`."""
    accelerator = str((node.hardware or {}).get("accelerator") or "")
    gpu = accelerator not in ("", "cpu") if accelerator else bool(node.gpu_model)
    tflops = speed_of(node)
    # the runtime the node reported (desktop/runtime); an older agent's environment is what
    # its hardware report says: a GPU accelerator and the torch it probed
    runtime = node.runtime or {}
    plan = str(runtime.get("plan") or "")
    torch = str(runtime.get("torch") or (node.hardware or {}).get("torch_version") or "")
    return NodeView(
        node.pk, node.kind, node.price_per_gpu_hour, node.memory_gb, node.reliability, gpu,
        float(tflops) if isinstance(tflops, int | float) else 0.0,
        (node.hardware or {}).get("isolation") == "full",
        plan not in ("", "cpu") if plan else gpu, torch,
    )  # fmt: skip


NEEDS_FIELDS = ("max_price_per_gpu_hour", "min_memory_gb", "min_vram_gb", "min_fp32_tflops",
                "gpu_required", "isolation_full", "gpu_runtime_required", "min_torch")  # fmt: skip


def job_needs(job: Job) -> JobNeeds:
    return JobNeeds(*(getattr(job, f) for f in NEEDS_FIELDS))


def online_candidates(job: Job) -> QuerySet[Node]:
    """The online nodes that may work on `job`: what its next lease could cost is read off
    them (ledger.reservations.unaffordable)."""
    return nodes_that_may_work_on(job).filter(pk__in=online_nodes().values("pk"))


@dataclass(frozen=True)
class Eligibility:
    """What decides which pending tasks a node may run (`eligible_tasks`), read once per
    claim: the running jobs `may_work_on` lets it work on, their open rounds (with their
    jobs: the candidate reads need no joins, their tasks no second read of their rounds) and
    what the rounds' plans keep it from."""

    node: Node
    jobs: list[Any]
    rules: PlanRules
    rounds: dict[int, Round] = field(default_factory=dict)


def eligibility(node: Node, opened: Iterable[Round] | None = None) -> Eligibility:
    """One read: the open rounds of the running jobs with their jobs (`opened`, when the
    caller read them with the node: claim_read.node_and_open_rounds). `may_work_on` picks
    the node's rounds in Python and the plans' rule (`_rules_for`) reads the same rows, so
    the running jobs, the plans and the open rounds are not three queries per claim."""
    offers = node_view(node)
    if opened is None:
        opened = Round.objects.filter(
            status=RoundStatus.OPEN, job__status=JobStatus.RUNNING
        ).select_related("job")
    works: dict[Any, bool] = {}
    rounds: dict[int, Round] = {}
    plans = []
    jobs_seen: dict[Any, Job] = {}
    for rnd in opened:
        # one Job per job (select_related gives each round its own): its spec parsed once
        job = rnd.job = jobs_seen.setdefault(rnd.job_id, rnd.job)
        if job.pk not in works:
            works[job.pk] = may_work_on(job_needs(job), offers)
        if works[job.pk]:
            rounds[rnd.pk] = rnd
        if rnd.plan:
            plans.append((rnd.pk, rnd.job_id, rnd.number, rnd.plan))
    jobs = sorted(pk for pk, ok in works.items() if ok)
    return Eligibility(node, jobs, _rules_for(node, plans) or PlanRules(), rounds)


def eligible_tasks(node: Node, known: Eligibility | None = None) -> QuerySet[Task]:
    """Pending tasks this node may run: job running, tier, price and hardware
    (`may_work_on`), never a second replica of a unit it already holds, and nothing the
    rounds' plans keep it from (`plan_rules`). The claim on PostgreSQL reads the same rule
    as one SQL statement (`_candidates_sql`)."""
    known = known or eligibility(node)
    mine = Task.objects.filter(round=OuterRef("round"), shard=OuterRef("shard"), node=node)
    qs = (
        Task.objects.filter(
            status=TaskStatus.PENDING,
            round__status=RoundStatus.OPEN,
            round__job__status=JobStatus.RUNNING,
            round__job__in=known.jobs,
        )
        .filter(Q(reserved_for__isnull=True) | Q(reserved_for=node))
        .exclude(Exists(mine))
    )
    rules = known.rules
    qs = qs.exclude(round__in=sorted(rules.sat_out)).exclude(
        round__in=sorted(rules.far), replica__gt=0
    )
    if node.kind == NodeKind.PLATFORM:
        # volunteer-tier jobs still use platform nodes to verify volunteers' results
        return qs.filter(~Q(round__job__tier=Tier.VOLUNTEER) | Q(replica__gt=0))
    return qs.exclude(round__job__tier=Tier.PLATFORM)


def plan_rules(nodes: Sequence[Node]) -> dict[int, PlanRules]:
    """node id -> what the open rounds' plans keep it from: the one rule for the live claim
    (`eligible_tasks`, through `eligibility`) and the bulk planner (`lease_batch`). Read in
    Python: one small query over the open rounds' plans, and one more per node that some
    plan has syncing every other round."""
    plans = Round.objects.filter(status=RoundStatus.OPEN, job__status=JobStatus.RUNNING)
    rows = list(plans.exclude(plan={}).values_list("pk", "job_id", "number", "plan"))
    out: dict[int, PlanRules] = {}
    for node in nodes:
        rules = _rules_for(node, rows)
        if rules is not None:
            out[node.pk] = rules
    return out


def _rules_for(node: Node, rows: Sequence[tuple[int, Any, int, dict]]) -> PlanRules | None:
    """What the plans `rows` (round id, job id, number, plan) keep `node` from, None for
    nothing. A node sits out the rounds its plan excludes it from (trainer.adapt: poor
    health) and those a far node's two-round work already spans (`_far_busy`), and takes no
    replica in a round it syncs every other round."""
    key = plan_key(node.pk)
    rounds: set[int] = set()
    far: dict[tuple[Any, int], int] = {}  # (job id, round number) -> round id
    for pk, job_id, number, plan in rows:
        if plan.get(key, {}).get("participate") is False:
            rounds.add(pk)
        elif is_far(plan, node.pk):
            far[(job_id, number)] = pk
    rounds.update(_far_busy(node, far))
    if rounds or far:
        return PlanRules(frozenset(rounds), frozenset(far.values()))
    return None


def _far_busy(node: Node, far: dict[tuple[Any, int], int]) -> list[int]:
    """Of the open rounds whose plan has this node syncing every other round, those its
    two-round work spans: it took its task of the round already, or its two-round task of
    the round before is still out or came in after that round closed. The simulator's far
    node does one task per two rounds; the agent, working one task at a time, is busy then
    anyway, and a lease it took there would only be folded in late once more."""
    if not far:
        return []
    spans = Q()
    for (job_id, number), pk in far.items():
        spans |= Q(round_id=pk) | Q(round__job_id=job_id, round__number=number - 1)
    tasks = Task.objects.filter(spans, node=node, status__in=[TaskStatus.LEASED, TaskStatus.DONE])
    busy = set()
    for job_id, number, plan, replica, status, late in tasks.values_list(
        "round__job_id", "round__number", "round__plan", "replica", "status", "result__late"
    ):
        if (job_id, number) in far:
            busy.add(far[(job_id, number)])  # its one task of this round
        elif replica == 0 and is_far(plan, node.pk) and (status == TaskStatus.LEASED or late):
            busy.add(far[(job_id, number + 1)])  # its two-round task runs into this round
    return list(busy)


def nodes_that_may_work_on(job: Job) -> QuerySet[Node]:
    """The node side of `eligible_tasks`' rule, seen from a job: the nodes whose price,
    hardware (`may_work_on`) and kind let them take some task of it (online or not)."""
    needs = job_needs(job)
    # every field node_view reads: a deferred one is a query per node
    fields = ("pk", "kind", "price_per_gpu_hour", "memory_gb", "reliability", "gpu_model",
              "hardware", "runtime", "benchmark", "speed_tflops")  # fmt: skip
    nodes = Node.objects.only(*fields)
    qs = Node.objects.filter(pk__in=[n.pk for n in nodes if may_work_on(needs, node_view(n))])
    if job.tier == Tier.PLATFORM:
        return qs.filter(kind=NodeKind.PLATFORM)
    return qs  # volunteer jobs: volunteers train, platform nodes verify


def preference(node: Node) -> list[Q]:
    """Platform nodes take replicas (verification work) first, volunteers primaries first."""
    groups = [Q(replica=0), Q(replica__gt=0)]
    return groups[::-1] if node.kind == NodeKind.PLATFORM else groups


def spot_draw(task_id: object) -> float:
    """The task's draw in [0, 1) for a random check: an HMAC of its id under the server's
    secret, so a node cannot tell which of its tasks are checked, while the same secret and
    task always draw the same (a test, or a replay, is not left to chance)."""
    digest = hmac.new(settings.SECRET_KEY.encode(), str(task_id).encode(), hashlib.sha256)
    return int.from_bytes(digest.digest()[:8], "big") / 2**64


def needs_replica(node: Node, task: Task) -> bool:
    """The one place replication is decided. BOINC adaptive replication for volunteers:
    every task of an untrusted node, then a random share (REPLICATION_SHARE). A platform
    node is the operator's, enrolled with a token, and trusted from the start, but its
    results are still spot-checked: PLATFORM_SPOT_CHECK_RATE of its tasks get a replica."""
    conf = settings.GPUFLEX
    if node.kind == NodeKind.PLATFORM:
        return spot_draw(task.pk) < conf["PLATFORM_SPOT_CHECK_RATE"]
    if on_probation(node):
        return True
    return spot_draw(task.pk) < conf["REPLICATION_SHARE"]


def proof_stands_in(spec: JobSpec, codec: str) -> bool:
    """A segment check drawn after the upload (marketplace/proofs) stands in for a replica:
    where the task commits to a chain (trainer.proof_commitment.provable) and checks are on.
    It re-runs a quarter of the task instead of all of it, which is what brings verification
    under a tenth of the compute (issue 35); an upload that comes without its proof after all
    (an agent older than proofs) is replicated then (proofs.services.after_upload)."""
    private = spec.privacy.clip_norm is not None
    return settings.GPUFLEX["SEGMENT_CHECK_SHARE"] > 0 and provable(private=private, codec=codec)


def extend_leases(held: Sequence[tuple[int, datetime, Sequence[str | None]]]) -> int:
    """Heartbeats naming the tasks their nodes hold keep those leases: a task may run longer
    than LEASE_TIMEOUT_S while its node is alive (and a node holds several at once: the one
    it trains, those it prefetched, the one whose update uploads), while a node that goes
    silent still loses them. `held` is (node id, heard at, task ids) per heartbeat, as
    nodes/presence.py writes them, one or a flush's batch: one conditional UPDATE each,
    which writes only the leases with less than half their time left, to a full timeout from
    when the heartbeat was heard. Ids that are not UUIDs are not ours and are skipped."""
    timeout = timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"])
    extended = 0
    for node_id, at, task_ids in held:
        ids = []
        for task_id in task_ids:
            try:
                ids.append(uuid.UUID(str(task_id)))
            except ValueError:
                continue  # not one of ours: nothing to keep
        if ids:
            extended += Task.objects.filter(
                pk__in=ids, node_id=node_id, status=TaskStatus.LEASED,
                lease_expires__lt=at + timeout / 2,
            ).update(lease_expires=at + timeout)  # fmt: skip
    return extended


def _declared_rows(node: Node, dataset: str) -> int:
    rows = (node.local_dataset_rows or {}).get(dataset)
    return rows if isinstance(rows, int) and rows > 0 else 0


def _lease_rows(task: Task, node: Node) -> int | None:
    """Federated: the silo's size as declared now, frozen for this lease (uploads.py); 0 for
    none, which no later declaration changes. None for a task on a shard."""
    if task.reserved_for_id is None:
        return None
    return _declared_rows(node, task.round.job.federated_dataset)


def _lease(task: Task, node: Node, sized: dict | None = None, key: str | None = None) -> bool:
    """Lease one task to `node` under the claim key `key` with a compare-and-set UPDATE (the
    path without row locks); whether it was won."""
    now = timezone.now()
    steps, batch, codec, replicate = _lease_terms(task, node, sized)
    won = Task.objects.filter(pk=task.pk, status=TaskStatus.PENDING).update(
        status=TaskStatus.LEASED,
        node=node,
        leased_at=now,
        lease_expires=now + timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"]),
        attempts=task.attempts + 1,
        steps=steps,
        batch_size=batch,
        codec=codec,
        price_per_gpu_hour=node.price_per_gpu_hour,
        # federated: the silo's size as declared now, frozen for this lease (uploads.py); 0
        # for none, which no later declaration changes
        declared_rows=_lease_rows(task, node),
        claim_key=key,
    )
    if won != 1:
        return False
    if replicate:
        add_replica(task, steps, batch, codec)
    job_changed(task.round.job_id)
    return True


def _lease_terms(
    task: Task, node: Node, sized: dict[tuple[Any, ...], tuple[int, int, str]] | None = None
) -> tuple[int, int, str, bool]:
    """(steps, batch size, codec, whether a replica is made) of `task` leased to `node`.
    `sized` keeps one claim's work sizes: its tasks of one round on equal shards get the
    same work, sized once."""
    job = task.round.job
    spec = job.parsed_spec
    steps, batch, codec = task.steps, task.batch_size, task.codec
    planned = task.round.plan.get(plan_key(node.pk))
    if steps is None and planned is not None:  # the round's plan, made at its opening
        work = planned_work(planned, spec)
        steps, batch, codec = work.steps, work.batch_size, work.codec
    elif steps is None:
        shard_size = task.shard.size if task.shard else 0
        memo = (task.round_id, shard_size)
        if sized is None or memo not in sized:
            work = size_work(
                spec, node, shard_size, input_shape=job.input_shape,
                num_classes=job.num_classes, model_file=task.round.input_model_file,
            )  # fmt: skip
            if sized is None:
                sized = {}
            sized[memo] = (work.steps, work.batch_size, work.codec)
        steps, batch, codec = sized[memo]
    # federated tasks train on data only their node has: a replica could not agree; and a
    # far node's two-round task is not replicated: a replica's on-time result would settle
    # the unit and the far node's update, folded in a round later, would be thrown away
    # (the statistical filter still screens it when it is folded in)
    # a private job's updates carry noise no other node can repeat: they are checked by the
    # noise check and the aggregation's screens instead (docs/privacy.md, "Verification")
    replicable = (task.shard_id is not None and not is_far(task.round.plan, node.pk)
                  and not spec.privacy.private
                  and not spec.privacy.secure_aggregation.enabled)  # fmt: skip
    replicate = (task.replica == 0 and replicable and not proof_stands_in(spec, codec)
                 and needs_replica(node, task))  # fmt: skip
    if replicate and codec == "topk":
        # top-k's error feedback makes an upload depend on the node's earlier tasks, so two
        # honest replicas would not agree; a verified task travels as deterministic int8
        codec = "int8"
    return steps, batch, codec, replicate


def add_replica(task: Task, steps: int | None, batch_size: int | None, codec: str = "none") -> None:
    """One more copy of the task's unit (same seed, work and codec) for another node to
    verify."""
    add_replicas([(task, steps, batch_size, codec)])


def add_replicas(made: Sequence[tuple[Task, int | None, int | None, str]]) -> None:
    """`add_replica` for several units at once (a claim's replicas), in one INSERT: each new
    row's replica number is one more than its unit's highest, read in the same statement.
    A unit appears at most once (a claim never leases two replicas of one unit); a unit that
    gained a replica meanwhile fails the unique (round, shard, replica) constraint, which
    the claim takes as any other race (IntegrityError: it is made again)."""
    if not made:
        return
    fields = Task._meta.concrete_fields
    table = Task._meta.db_table
    number = (
        f"(SELECT COALESCE(MAX(m.replica), -1) + 1 FROM {table} m "
        "WHERE m.round_id = %s AND m.shard_id = %s)"
    )
    rows, params = [], []
    for task, steps, batch_size, codec in made:
        new = Task(
            round_id=task.round_id, shard_id=task.shard_id, seed=task.seed, steps=steps,
            batch_size=batch_size, codec=codec,
        )  # fmt: skip
        values = []
        for f in fields:
            if f.attname == "replica":
                values.append(number)
                params += [task.round_id, task.shard_id]
            else:
                values.append("%s")
                params.append(f.get_db_prep_save(f.pre_save(new, add=True), connection))
        rows.append(f"({', '.join(values)})")
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {', '.join(rows)}", params)
    transaction.on_commit(bump_work_generation)


# the most tasks one claim leases (`POST agent/claim?max=N`)
MAX_CLAIM_BATCH = 8
# the most tasks one heartbeat keeps leased (its `task_ids`): a few claim batches' worth
MAX_HEARTBEAT_TASKS = 32


def claim_next(node: Node) -> Task | None:
    """Lease the next eligible task to `node`, or None."""
    tasks = claim_batch(node, 1)
    return tasks[0] if tasks else None


def claim_batch(node: Node | int, count: int, key: str | None = None) -> list[Task]:
    """`_claim`'s tasks."""
    return _claim(node, count, key)[0]


def _claim(node: Node | int, count: int, key: str | None = None) -> tuple[list[Task], bool]:
    """(tasks, whether they are a re-sent claim's answer again). Lease up to `count` eligible
    tasks to `node` (a node or its id) in one transaction, best first: one round trip, one
    read of the open rounds' plans and one locked scan for a node that runs or prefetches
    several (a server with many GPUs). Never two replicas of one unit. Given an id on
    PostgreSQL, the node's row comes with the open rounds, in one statement (`claim_read`).

    `key`: the claim's Idempotency-Key, written on what it leases. When the node still holds
    leases made under that key (a claim whose answer was lost, sent again), those tasks are
    the answer and nothing more is leased: a lost answer costs no orphaned lease."""
    locked = connection.features.has_select_for_update_skip_locked
    known = None
    again: list[Any] | None = None  # looked up with the node's row, where it is read
    if isinstance(node, int):
        if locked:
            node, opened, again = node_and_open_rounds(node, key)
            known = eligibility(node, opened)
        else:
            node = Node.objects.get(pk=node)
    if key and again is None:
        again = list(leased_under(node.pk, key))
    if again:
        return _by_ids(again), True
    if node.reliability < settings.GPUFLEX["MIN_RELIABILITY"] or count < 1:
        return [], False
    if locked:
        return _claim_locked(node, count, known, key), False
    for _ in range(8):  # only SQLite can lose the compare-and-set; retry a few times
        try:
            with transaction.atomic():
                won, lost = _lease_best(node, count, skip_locked=False, key=key)
            if won or not lost:
                obs.leased(len(won))  # counted once this claim's transaction has committed
                return _by_ids(won), False
        except IntegrityError:
            continue  # raced into a unit this node already holds; pick another
    return [], False


class _Short(Exception):
    """The optimistic claim found a job's free escrow short of its leases: roll it back."""


def leased_under(node_id: int, key: str) -> QuerySet[Task, Any]:
    """The ids of the tasks `node_id` holds leased under the claim key `key`, in claim order
    (as `claim_read` reads them on PostgreSQL)."""
    leased = Task.objects.filter(node_id=node_id, status=TaskStatus.LEASED, claim_key=key)
    return leased.order_by("replica", "round_id", "shard_id").values_list("pk", flat=True)


def _by_ids(ids: list[Any]) -> list[Task]:
    """The tasks of `ids` in that order, with their rounds, jobs and shards (shared)."""
    by_id = Task.objects.select_related("round__job", "shard").in_bulk(ids)
    return share_related([by_id[pk] for pk in ids if pk in by_id])


def _claim_locked(
    node: Node, count: int, known: Eligibility | None = None, key: str | None = None
) -> list[Task]:
    """The PostgreSQL claim: the candidates are row-locked (SKIP LOCKED), so nothing can win
    them from us. First optimistically: choose and lease as if every job could pay, and only
    then lock the jobs' escrow, read it and write the reservations (`reserve_all`: one call
    sent with the transaction's COMMIT), so every other claim on the job queues behind that
    call and the commit, not behind the whole claim. When some job's free escrow turns out
    short, that transaction is rolled back and the claim is made again the careful way
    (`_lease_best`: each lease checked against the escrow as it is chosen), which leases
    exactly what the optimistic one would have whenever the escrow covers it all. `known`:
    the node's eligibility as read with its row, for the first try (a try made again reads
    it again)."""
    for careful in (False, True, True):
        try:
            with transaction.atomic():
                if careful:
                    won, _ = _lease_best(node, count, skip_locked=True, key=key)
                    tasks = won
                else:
                    tasks = _lease_optimistic(node, count, known, key)
        except _Short:
            continue
        except IntegrityError:
            continue  # raced into a unit this node already holds; pick another
        obs.leased(len(tasks))  # counted once this claim's transaction has committed
        return tasks
    return []


def _lease_optimistic(
    node: Node, count: int, known: Eligibility | None = None, key: str | None = None
) -> list[Task]:
    """Lease the best `count` candidates, then reserve their escrow; `_Short` if a job's
    free escrow does not cover its share (the caller's transaction is then rolled back)."""
    chosen = _choose(node, count, known or eligibility(node), None)
    if not chosen:
        return []
    _lease_locked(node, chosen, key)
    # the jobs' escrow locks, waited, the check, the reservations and (where this claim's
    # block is the outermost) the COMMIT that releases the locks, in one round trip
    if not reserve_all([(task.pk, task.round.job_id) for task, _ in chosen], node, commit=True):
        raise _Short
    return [task for task, _ in chosen]


def _choose(
    node: Node, count: int, pool: Eligibility, funds: Funds | None
) -> list[tuple[Task, tuple[int, int, str, bool]]]:
    """Up to `count` row-locked candidates of `pool` in preference and claim order, never two
    of one unit, with their lease terms; with `funds`, only what the escrow affords (each
    reserved as it is chosen)."""
    chosen: list[tuple[Task, tuple[int, int, str, bool]]] = []
    units: set[tuple[Any, ...]] = set()
    sized: dict[tuple[Any, ...], tuple[int, int, str]] = {}
    for replicas in (True, False) if node.kind == NodeKind.PLATFORM else (False, True):
        if len(chosen) >= count:  # the groups of `preference`
            break
        # a few spares: replicas of one unit are skipped. A round's primaries are each their
        # own unit, so they need spares only for a job the escrow cannot afford; every row
        # read here is locked until the claim commits, for the other claims to skip
        spare = count + 2 if replicas else 2
        candidates = _candidates_sql(pool, replicas, count + spare)
        for i in range(len(candidates)):
            if len(chosen) >= count:
                break
            task = candidates[i]  # built as read: none past the last one taken
            unit = (task.round_id, *task.unit)
            if unit in units:
                continue
            if funds is not None:
                if not funds.affords(task.round.job_id, node):
                    continue
                funds.reserve(task.pk, task.round.job_id, node)
            chosen.append((task, _lease_terms(task, node, sized)))
            units.add(unit)
    return chosen


def share_related(tasks: list[Task]) -> list[Task]:
    """One Round and one Job instance per round and job among `tasks` (select_related gives
    each row its own): a job's spec is then parsed once per claim (`Job.parsed_spec` is
    cached on the instance), not once per task."""
    rounds: dict[Any, Round] = {}
    jobs: dict[Any, Job] = {}
    for task in tasks:
        rnd = rounds.setdefault(task.round_id, task.round)
        rnd.job = jobs.setdefault(rnd.job_id, rnd.job)
        task.round = rnd
    return tasks


def _lease_best(
    node: Node, count: int, skip_locked: bool, key: str | None = None
) -> tuple[list[Any], bool]:
    """(what was leased, whether a compare-and-set was lost) within the caller's
    transaction, each lease checked against its job's escrow as it is chosen.

    With row locks (PostgreSQL) the candidates are this transaction's until it ends, so
    their leases are written together in one UPDATE after the choice, and the leased Task
    instances are returned; without them (SQLite) each lease is its own compare-and-set,
    which another claim may win, and the ids won are returned."""
    funds = Funds()  # each lease reserves its most possible charge in its job's escrow
    if skip_locked:
        chosen = _choose(node, count, eligibility(node), funds)
        if chosen:
            _lease_locked(node, chosen, key)
        funds.save()
        return [task for task, _ in chosen], False
    pool = eligible_tasks(node)  # once: building it reads the open rounds' plans
    won: list[Any] = []
    units: set[tuple[Any, ...]] = set()
    sized: dict[tuple[Any, ...], tuple[int, int, str]] = {}
    lost = False
    for group in preference(node):
        if len(won) >= count:
            break
        # a few spares: replicas of one unit are skipped, and SQLite may lose a lease
        for task in _candidates(pool.filter(group), node, 2 * count + 2, False):
            unit = (task.round_id, *task.unit)
            if len(won) >= count:
                break
            if unit in units or not funds.affords(task.round.job_id, node):
                continue
            if _lease(task, node, sized, key):
                won.append(task.pk)
            else:
                lost = True
                continue
            funds.reserve(task.pk, task.round.job_id, node)
            units.add(unit)
    funds.save()
    return won, lost


def _lease_locked(
    node: Node, chosen: list[tuple[Task, tuple[int, int, str, bool]]], key: str | None = None
) -> None:
    """Lease rows this transaction holds locked (FOR UPDATE) to `node` under the claim key
    `key`: one UPDATE for all of them, then the replicas the terms ask for, and one ring per
    job."""
    now = timezone.now()
    expires = now + timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"])
    leases = [
        (task.pk, node.pk, steps, batch, codec, node.price_per_gpu_hour, _lease_rows(task, node))
        for task, (steps, batch, codec, _) in chosen
    ]
    if _bulk_lease_postgres(leases, now, expires, key) != len(leases):
        # cannot happen while the rows are locked; if it did, nothing of this claim stays
        raise IntegrityError("a locked candidate was no longer pending")
    for (task, _), (_, _, steps, batch, codec, price, rows) in zip(chosen, leases, strict=True):
        # what the UPDATE wrote, on the locked rows read in this transaction: the claim
        # answers from these instances instead of reading the rows back
        task.status, task.node, task.leased_at, task.lease_expires = (
            TaskStatus.LEASED, node, now, expires,
        )  # fmt: skip
        task.attempts += 1
        task.steps, task.batch_size, task.codec = steps, batch, codec
        task.price_per_gpu_hour, task.declared_rows = price, rows
        task.claim_key = key
    add_replicas([(task, *terms[:3]) for task, terms in chosen if terms[3]])
    job_changed(*{task.round.job_id for task, _ in chosen})


def _candidates(pool: QuerySet[Task], node: Node, n: int, skip_locked: bool) -> list[Task]:
    """The first `n` of `pool` in claim order: CLAIM_ORDER, with the shards this node already
    holds first within a round (its input cache serves them, so the node downloads nothing
    but the model: affinity, as in caching-aware schedulers).

    Read as two queries in CLAIM_ORDER that each stop after `n` rows off the partial index:
    the tasks on shards the node holds, and all tasks. Merged and cut to `n` they are exactly
    the claim order's first `n` (each of those is within the first `n` of one of the two).
    Ordering the whole pool by an affinity subquery instead reads and sorts every pending
    task: seconds per claim with 100,000 pending."""
    held = ShardCopy.objects.filter(node=node).values("shard_id")
    lists = [pool.filter(shard__in=held), pool]
    if skip_locked:
        lists = [q.select_for_update(skip_locked=True, of=("self",)) for q in lists]
    found: dict[Any, tuple[tuple[Any, ...], Task]] = {}
    for affine, qs in zip((True, False), lists, strict=True):
        for task in qs.order_by(*CLAIM_ORDER).select_related("shard")[:n]:
            if task.pk not in found:
                no_shard = task.shard_id is None  # federated: last, as NULLs sort in SQL
                key = (task.replica, task.round_id, not affine, no_shard, task.shard_id or 0)
                found[task.pk] = (key, task)
    # a held task the second list also returned keeps the first list's (affine) key
    return _with_rounds([task for _, task in sorted(found.values(), key=lambda kt: kt[0])][:n])


def _candidates_sql(known: Eligibility, replicas: bool, n: int) -> Sequence[Task]:
    """`_candidates` of `eligible_tasks(node).filter(preference group)` on PostgreSQL, row-
    locked (SKIP LOCKED), as two hand-written reads over the tasks alone, sent as one
    statement: the same rule, with its round-level clauses (round open, job running and
    `may_work_on`, tier, the plans' sat-out and far rounds) applied to the open rounds
    (`Eligibility.rounds`) in Python first. Compiling that queryset twice per claim was most
    of a claim's CPU, and planning its joins most of PostgreSQL's. `replicas`: the group of
    replicas (else the primaries). Instances are built for the rows kept, as they are read.
    tests/marketplace/test_claim_sql.py holds it to the queryset's answers."""
    node, rules = known.node, known.rules
    platform = node.kind == NodeKind.PLATFORM
    rounds = known.rounds
    allowed = [
        pk
        for pk, tier in ((pk, rnd.job.tier) for pk, rnd in rounds.items())
        if pk not in rules.sat_out
        and not (replicas and pk in rules.far)
        # platform nodes verify volunteer-tier jobs (replicas only); volunteers never work
        # on platform-tier jobs
        and not (platform and not replicas and tier == Tier.VOLUNTEER)
        and not (not platform and tier == Tier.PLATFORM)
    ]
    if not allowed:
        return []
    task_f = [f.column for f in Task._meta.concrete_fields]
    shard_f = [f.column for f in Shard._meta.concrete_fields]
    where = f"""
        t.status = {constant(TaskStatus.PENDING)} AND t.round_id = ANY(%(rounds)s::bigint[])
        AND (t.reserved_for_id IS NULL OR t.reserved_for_id = %(node)s)
        AND NOT EXISTS (SELECT 1 FROM {Task._meta.db_table} m WHERE m.round_id = t.round_id
                        AND m.shard_id = t.shard_id AND m.node_id = %(node)s OFFSET 0)
        AND {"t.replica > 0" if replicas else "t.replica = 0"}
    """
    # OFFSET 0 keeps the NOT EXISTS a probe of task_one_replica_per_node for each candidate
    # the pending index yields, which stops after `n`: turned into an anti join (as PostgreSQL
    # does without it) it read that whole index for the node's entries, on every claim, its
    # cost growing with the table (docs/scale.md, ninth pass)
    held = (
        f"AND t.shard_id IN (SELECT c.shard_id FROM {ShardCopy._meta.db_table} c "
        "WHERE c.node_id = %(node)s)"
    )
    params = {
        "rounds": array_literal(sorted(allowed)),
        "node": node.pk,
    }
    columns = ", ".join([f"t.{c}" for c in task_f] + [f"s.{c}" for c in shard_f])

    def select(extra: str) -> str:
        return f"""
            SELECT {columns}
            FROM {Task._meta.db_table} t
            LEFT JOIN {Shard._meta.db_table} s ON s.id = t.shard_id
            WHERE {where} {extra}
            ORDER BY t.replica, t.round_id, t.shard_id
            LIMIT {int(n)}
            FOR UPDATE OF t SKIP LOCKED
        """

    # both reads in one statement (one round trip): each CTE locks and stops after `n` rows
    # off the index as its own statement did; a row both return is locked twice by this
    # transaction, which SKIP LOCKED does not skip
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            WITH affine AS MATERIALIZED ({select(held)}),
                 anyone AS MATERIALIZED ({select("")})
            SELECT true, * FROM affine UNION ALL SELECT false, * FROM anyone
            """,
            params,
        )
        rows = cursor.fetchall()
    pk, replica, round_id, shard_id = (
        1 + task_f.index(c) for c in ("id", "replica", "round_id", "shard_id")
    )
    found: dict[Any, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for row in sorted(rows, key=lambda r: not r[0]):  # a held task keeps its affine key
        if row[pk] not in found:
            no_shard = row[shard_id] is None  # federated: last, as NULLs sort in SQL
            key = (row[replica], row[round_id], not row[0], no_shard, row[shard_id] or 0)
            found[row[pk]] = (key, row)
    kept = [row for _, row in sorted(found.values(), key=lambda kr: kr[0])[:n]]

    def build(row: tuple[Any, ...]) -> Task:
        task = Task.from_db(connection.alias, None, row[1 : 1 + len(task_f)])
        shard = row[1 + len(task_f) :]
        task.shard = Shard.from_db(connection.alias, None, shard) if shard[0] else None
        task.round = rounds[task.round_id]  # the rounds and jobs read once, shared
        return task

    return _Built(kept, build)


class _Built(Sequence[Task]):
    """Candidate rows made into Task instances only when read: a claim takes its first few
    and rarely reaches the spares, and a Task and its Shard cost more to build than to
    read."""

    def __init__(self, rows: list[tuple[Any, ...]], build: Any) -> None:
        self._rows, self._build = rows, build
        self._built: dict[int, Task] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self._rows))[i]  # negative indexes, and IndexError past the end
        if i not in self._built:
            self._built[i] = self._build(self._rows[i])
        return self._built[i]


def _with_rounds(tasks: list[Task]) -> list[Task]:
    """Each round and its job read once (usually one of each), not once per candidate row:
    a job's spec and a round's plan (an entry per node) are the rows' biggest columns."""
    rounds = Round.objects.select_related("job").in_bulk({task.round_id for task in tasks})
    for task in tasks:
        task.round = rounds[task.round_id]
    return tasks


def claim_with_wait(
    node: Node | int, wait: float, count: int = 1, key: str | None = None
) -> list[Task]:
    """Long poll: try, then sleep with backoff until new work is signalled or `wait` ends.
    `key`: the claim's Idempotency-Key (`claim_batch`).

    Between tries the database is only asked again when the work-generation counter moved
    (a cache read) or every couple of seconds, so idle nodes cost the database little.
    """
    deadline = time.monotonic() + max(0.0, wait)
    delay = 0.05
    # read before the first try, so that work signalled during it is not missed; a claim
    # that does not wait never reads it (a Redis round trip for nothing)
    seen = work_generation() if wait > 0 else 0
    last_db = time.monotonic()
    tasks, again = _claim(node, count, key)
    while not tasks:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            obs.claimed(0)
            return []
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.25)  # a counter read: a new round is seen within 0.25 s
        generation = work_generation()
        if generation != seen or time.monotonic() - last_db >= _FALLBACK_POLL_S:
            seen, last_db = generation, time.monotonic()
            tasks, again = _claim(node, count, key)
    obs.claimed(len(tasks), again)
    return tasks


def overlap_allowed(task: Task) -> bool:
    """Whether the node may train on while this task's update uploads and merge that progress
    into its next task of the job (docs/agent-api.md, "Overlap"): the job asks for it, and
    the update is the node's alone to shape. Not for federated jobs, not under clipped
    (private) updates, whose bound the merged progress would escape, and not for a unit that
    is replicated: replicas are compared bit for bit, and merged progress is node history
    (as top-k's residual is, see `_lease`)."""
    job = task.round.job
    spec = job.parsed_spec
    if not (spec.adaptation.enabled and spec.adaptation.overlap) or job.is_federated:
        return False
    if spec.scoring:  # nothing trains on
        return False
    if spec.privacy.clip_norm is not None or task.replica != 0:
        return False
    replicas = Task.objects.filter(round_id=task.round_id, shard_id=task.shard_id, replica__gt=0)
    return not replicas.exists()


def task_payloads(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    """The payloads of one claim's tasks: how the node gets a round's model is worked out
    (and a seeded model recorded) once per round, not once per task."""
    sources: dict[tuple[Any, Any], dict[str, Any]] = {}
    return [task_payload(task, sources) for task in tasks]


def task_payload(
    task: Task, sources: dict[tuple[Any, Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The task as docs/agent-api.md defines it. `sources` keeps the model sources already
    worked out for (node, round): the same for every task of a round the node leases."""
    job = task.round.job
    memo = (task.node_id, task.round_id)
    source = sources.get(memo) if sources is not None else None
    if source is None:
        source = model_source(task)
        if source["kind"] == "seed":
            # the node builds round 1's model itself as it starts the task: it holds it from
            # now on, whatever becomes of its update, and later rounds can come as deltas
            record_model(task.node_id, job, task.round)
        if sources is not None:
            sources[memo] = source
    payload = {
        "id": str(task.id),
        "job_id": str(job.id),
        "round": task.round.number,
        "kind": job.kind,
        "spec": job.spec,
        "steps": task.steps,
        "batch_size": task.batch_size,
        "seed": task.seed,
        "codec": task.codec,
        "proximal_mu": job.proximal_mu,
        # the round's learning rate (optimizer.schedule, trainer.schedule.round_lr)
        "lr": round_lr(job.parsed_spec, task.round.number),
        "deadline": task.lease_expires,
        "model_hash": task.round.input_model_hash,
        "model_source": source,
        "shard_hash": task.shard.content_hash if task.shard else None,
        "overlap": overlap_allowed(task),
        # trainer.fit.Footprint: the agent checks the task fits its free memory
        "footprint": job.footprint,
    }
    if job.parsed_spec.model.arch == "exported":
        # the buyer's program: GET agent/tasks/ID/program, read by the sandboxed runner
        payload["program"] = True
    if job.is_federated:
        # proposed addition to docs/agent-api.md: train on this named local dataset
        payload["local_dataset"] = job.federated_dataset
    return payload


def lease_batch(nodes: list[Node], *, slots: int = 1) -> int:
    """Lease pending tasks to many nodes at once (bulk scheduling); returns leases made.

    On PostgreSQL the candidates are locked (SKIP LOCKED) for the transaction, so one bulk
    UPDATE is safe; without row locks (SQLite) each lease is its own compare-and-set.
    Rows are read as tuples, never as model instances: this is the hot path for big fleets.
    """

    now = timezone.now()
    expires = now + timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"])
    with transaction.atomic():
        pending = Task.objects.filter(
            status=TaskStatus.PENDING,
            reserved_for__isnull=True,  # federated tasks wait for their own node's claim
            round__status=RoundStatus.OPEN,
            round__job__status=JobStatus.RUNNING,
        ).order_by(*CLAIM_ORDER)
        locked = connection.features.has_select_for_update_skip_locked
        if locked:
            pending = pending.select_for_update(skip_locked=True, of=("self",))
        rows = list(
            pending.values_list(
                "id", "round_id", "shard_id", "replica", "round__job_id", "steps",
                "batch_size", "shard__size", "codec",
            )
        )  # fmt: skip
        jobs = {j.pk: j for j in Job.objects.filter(pk__in={r[4] for r in rows})}
        specs = {pk: j.parsed_spec for pk, j in jobs.items()}
        views = [
            TaskView(
                id=i,
                job=job_id,
                unit=(round_id, shard_id),
                replica=replica,
                tier=jobs[job_id].tier,
                needs=job_needs(jobs[job_id]),
            )
            for i, round_id, shard_id, replica, job_id, *_ in rows
        ]
        held = Task.objects.filter(
            status=TaskStatus.LEASED, round__status=RoundStatus.OPEN
        ).values_list("round_id", "shard_id", "node_id")
        plan = plan_assignments(
            views,
            [node_view(n) for n in nodes],
            slots=slots,
            min_reliability=settings.GPUFLEX["MIN_RELIABILITY"],
            held=(((r, s), n) for r, s, n in held),
            rules=plan_rules(nodes),
        )
        by_id = {r[0]: r for r in rows}
        by_node = {n.pk: n for n in nodes}
        leases = []
        adaptive = {
            pk: plan_works(specs[pk], jobs[pk].input_shape, jobs[pk].num_classes, nodes)
            for pk in specs
            if specs[pk].adaptation.enabled and jobs[pk].input_shape
        }
        funds = Funds()  # each lease reserves its most possible charge in its job's escrow
        funds.load(jobs)
        for task_id, node_id in plan:
            _, _, _, _, job_id, steps, batch, shard_size, codec = by_id[task_id]
            node = by_node[node_id]
            if not funds.affords(job_id, node):
                continue  # the job's free escrow cannot pay for this lease: it stays pending
            if steps is None:
                work = (
                    adaptive[job_id][node_id]
                    if job_id in adaptive
                    else size_work(specs[job_id], node, shard_size)
                )
                steps, batch, codec = work.steps, work.batch_size, work.codec
            # no federated task here (reserved ones wait for their node's claim): no rows
            leases.append((task_id, node_id, steps, batch, codec, node.price_per_gpu_hour, None))
            funds.reserve(task_id, job_id, node)
        job_changed(*{by_id[lease[0]][4] for lease in leases})
        if locked:
            _bulk_lease_postgres(leases, now, expires)
            funds.save()
            obs.leased(len(leases))
            return len(leases)
        won = _bulk_lease_guarded(leases, now, expires)
        if won < len(leases):  # another process won some rows: reserve only what was leased
            ours = set(Task.objects.filter(pk__in=[lease[0] for lease in leases],
                                           leased_at=now).values_list("pk", flat=True))  # fmt: skip
            funds.made = [r for r in funds.made if r[0] in ours]
        funds.save()
        obs.leased(won)
        return won


def _bulk_lease_guarded(leases: list[tuple], now: datetime, expires: datetime) -> int:
    """Without row locks: one compare-and-set UPDATE per lease, sent with executemany (a
    C loop, not an ORM call per row); the summed row count says how many were won."""
    if not leases:
        return 0
    table = Task._meta.db_table
    field = Task._meta.get_field

    def prep(name: str, value: object) -> object:
        return field(name).get_db_prep_save(value, connection)

    params = [
        (
            TaskStatus.LEASED,
            prep("node", node_id),
            prep("leased_at", now),
            prep("lease_expires", expires),
            steps,
            batch,
            codec,
            prep("price_per_gpu_hour", price),
            prep("id", task_id),
            TaskStatus.PENDING,
        )
        for task_id, node_id, steps, batch, codec, price, _rows in leases  # no federated
    ]
    sql = (
        f"UPDATE {table} SET status = %s, node_id = %s, leased_at = %s, lease_expires = %s, "
        "steps = %s, batch_size = %s, codec = %s, price_per_gpu_hour = %s, "
        "attempts = attempts + 1, claim_key = NULL "
        "WHERE id = %s AND status = %s"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
        return cursor.rowcount


def _bulk_lease_postgres(
    leases: list[tuple], now: datetime, expires: datetime, key: str | None = None
) -> int:
    """One UPDATE ... FROM unnest(arrays): Django's bulk_update builds a CASE per row and
    field, which costs seconds of Python for thousands of rows. Returns the rows leased,
    each under the claim key `key` (None: leased by the server's own schedule)."""
    if not leases:
        return 0
    ids, nodes, steps, batches, codecs, prices, rows = (
        list(column) for column in zip(*leases, strict=True)
    )
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Task._meta.db_table} AS t
            SET status = %s, node_id = v.node_id, steps = v.steps, batch_size = v.batch_size,
                codec = v.codec, price_per_gpu_hour = v.price, attempts = t.attempts + 1,
                declared_rows = v.declared_rows, leased_at = %s, lease_expires = %s,
                claim_key = %s
            FROM unnest(%s::uuid[], %s::bigint[], %s::int[], %s::int[], %s::text[],
                        %s::numeric[], %s::bigint[])
                AS v(id, node_id, steps, batch_size, codec, price, declared_rows)
            WHERE t.id = v.id AND t.status = %s
            """,
            [
                TaskStatus.LEASED,
                now,
                expires,
                key,
                *map(array_literal, (ids, nodes, steps, batches, codecs, prices, rows)),
                TaskStatus.PENDING,
            ],
        )
        return cursor.rowcount
