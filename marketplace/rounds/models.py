"""Rounds, tasks (leases) and task results (the ledger's input), and what nodes hold of a
job: its model and its shards."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from marketplace.jobs.models import Job, Shard


class RoundStatus(models.TextChoices):
    OPEN = "open"
    AGGREGATING = "aggregating"
    DONE = "done"
    CANCELLED = "cancelled"


class Round(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rounds")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=RoundStatus.choices, default=RoundStatus.OPEN)
    input_model_hash = models.CharField(max_length=64)
    input_model_file = models.CharField(max_length=300)
    # jobs that deliver models as deltas (trainer.delivery): the payload that leads from the
    # previous round's input model (`input_delta_base`) to this one; "" when there is none
    input_delta_file = models.CharField(max_length=300, blank=True)
    input_delta_base = models.CharField(max_length=64, blank=True)
    input_delta_size = models.PositiveIntegerField(default=0)
    # adaptive jobs: the policy's plan for the nodes online at the opening ("n<node id>" ->
    # participate, steps, batch_size, codec, tier, health); a node it sits out takes no task
    plan = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField(auto_now_add=True)
    deadline = models.DateTimeField()
    # the round's deadline period (the plan's, else the spec's or the default) and the plan's
    # quorum in updates (null: unplanned), as trainer.round_lifecycle applies them
    deadline_s = models.FloatField(null=True, blank=True)
    plan_quorum = models.PositiveIntegerField(null=True, blank=True)
    # deadlines passed without enough updates to aggregate; at MAX_DEADLINES the job fails
    deadlines_passed = models.PositiveSmallIntegerField(default=0)
    closed_at = models.DateTimeField(null=True, blank=True)
    # set on entering AGGREGATING; the tick re-enqueues an aggregation that has stalled
    aggregating_since = models.DateTimeField(null=True, blank=True)
    # how often the tick re-enqueued this round's aggregation; past a limit the job fails
    aggregation_restarts = models.PositiveSmallIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="round_unique_number"),
            # at most one round of a job in flight at a time
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(status__in=["open", "aggregating"]),
                name="round_one_active_per_job",
            ),
        ]
        ordering = ["number"]


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"  # an update was accepted for it
    FAILED = "failed"  # gave up after too many attempts
    CANCELLED = "cancelled"  # round closed or job cancelled before it finished


class Task(models.Model):
    """One lease-able unit of work: a shard in a round, possibly one of several replicas.

    Replicas (replica > 0) of the same (round, shard) run with the same seed, steps and batch
    size on different nodes, so honest results agree and can verify each other.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="tasks")
    # None for federated tasks: the node trains on its own local dataset
    shard = models.ForeignKey(
        Shard, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks"
    )
    # federated tasks are made for one node (the silo); nobody else may lease them
    reserved_for = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="reserved"
    )
    replica = models.PositiveSmallIntegerField(default=0)
    seed = models.BigIntegerField()
    # fixed at the first lease of the unit (see sizing.py) and copied to replicas
    steps = models.PositiveIntegerField(null=True, blank=True)
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    # federated: the rows the node had declared for the job's dataset when it took the lease,
    # the most its update may weigh; a node re-declaring its dataset mid-round cannot raise it
    declared_rows = models.PositiveBigIntegerField(null=True, blank=True)
    codec = models.CharField(max_length=16, default="none")
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks"
    )
    leased_at = models.DateTimeField(null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True)
    # the node's price when it took the lease: what the ledger will charge per GPU-hour
    price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, null=True)
    # zones jobs: the aggregator the node handed its update to, and that update's hash (the
    # node's own word, checked against the aggregator's manifest); cleared on release
    zone_aggregator = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    zone_update_hash = models.CharField(max_length=64, blank=True, default="")
    # the Idempotency-Key of the claim that leased it (none for a lease the server made on
    # its own): a claim re-sent with that key, its answer lost, is answered these tasks again
    claim_key = models.CharField(max_length=64, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    @property
    def unit(self) -> tuple[int | None, int | None]:
        """What replicas share: the shard, or for a federated task the silo (its node)."""
        return (self.shard_id, self.reserved_for_id)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["round", "shard", "replica"], name="task_unique_replica"
            ),
            models.UniqueConstraint(
                fields=["round", "reserved_for"],
                condition=Q(reserved_for__isnull=False),
                name="task_one_per_silo",
            ),
            # a node never holds two replicas of one unit: they would not verify anything
            models.UniqueConstraint(
                fields=["round", "shard", "node"],
                condition=Q(node__isnull=False),
                name="task_one_replica_per_node",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "round"]),
            models.Index(fields=["status", "lease_expires"]),
            # the claim order (scheduling.CLAIM_ORDER) over pending tasks only
            models.Index(
                fields=["replica", "round", "shard"],
                condition=Q(status="pending"),
                name="task_pending_order",
            ),
            # the claim order of a round's pending primaries, led by the round: the candidate
            # read's primaries are this index's range for the open rounds, where through
            # task_pending_order the rounds are a filter. Without it PostgreSQL's generic
            # plan costed walking the unique constraint's index (every leased task of the
            # round, from the first) as cheap as the partial index (docs/scale.md, ninth pass)
            models.Index(
                fields=["round", "shard"],
                condition=Q(status="pending", replica=0),
                name="task_pending_primary",
            ),
            # a re-sent claim's lookup: the few tasks leased to the node, by claim key
            models.Index(
                fields=["node", "claim_key"],
                condition=Q(status="leased"),
                name="task_leased_claim",
            ),
        ]


class Precision(models.TextChoices):
    """trainer.replicas.PRECISIONS: what local training ran in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class ZonePartial(models.Model):
    """One pre-aggregated upload of a zone's aggregator (trainer.zones): the samples-weighted
    sum of its members' updates, stored as their mean, and the manifest naming each member.
    Each member's TaskResult points here; aggregation counts the partial once."""

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="zone_partials")
    aggregator = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+")
    zone = models.CharField(max_length=64)
    update_file = models.CharField(max_length=300, help_text="the members' weighted mean")
    update_hash = models.CharField(max_length=64, help_text="sha256 of the uploaded bytes")
    size = models.PositiveBigIntegerField(default=0, help_text="bytes uploaded")
    num_samples = models.PositiveIntegerField()
    manifest = models.JSONField(default=list, help_text="the members, as uploaded")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["round", "update_hash"], name="zone_partial_once")
        ]


class TaskResult(models.Model):
    """An accepted upload and what verification made of it: the ledger charges
    credited results at price x compute_s."""

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="result")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="results")
    update_file = models.CharField(max_length=300)
    update_hash = models.CharField(max_length=64, help_text="sha256 of the uploaded bytes")
    num_samples = models.PositiveIntegerField()
    metrics = models.JSONField(default=dict)
    compute_s = models.FloatField(default=0.0)
    # the precision the node says it trained in (its upload's metadata): replicas are compared
    # by trainer.replicas.agreement, which takes the claims into account
    precision = models.CharField(max_length=8, choices=Precision.choices, default=Precision.FP32)
    # the kind of device it says it trained on ("cpu", "cuda", "mps"; "" from older agents)
    device = models.CharField(max_length=8, blank=True, default="")
    # False once statistics or a replica majority reject it
    accepted = models.BooleanField(default=True)
    # None: not replicated; True: agreed with a replica majority; False: in the minority
    verified = models.BooleanField(null=True)
    verified_against = models.JSONField(default=list, help_text="node ids of the replicas")
    cosine = models.FloatField(null=True, blank=True)
    rejection = models.CharField(max_length=200, blank=True)
    aggregated = models.BooleanField(default=False)
    credited = models.BooleanField(default=False)
    # uploaded after its round closed (spec rounds.late_updates: stale): a later round folds
    # it in with a staleness weight, then marks it aggregated
    late = models.BooleanField(default=False)
    # came through a zone's aggregator: `update_file` is "" and the partial holds the sum
    partial = models.ForeignKey(
        ZonePartial, null=True, blank=True, on_delete=models.CASCADE, related_name="results"
    )
    created_at = models.DateTimeField(auto_now_add=True)


class ReceivedUpdate(models.Model):
    """An upload the web process took in but has not checked (issue 36: decoding it against
    the round's model needs torch, which only the worker imports). Its task stays leased and
    counts as in flight; the worker's check (rounds.update_checks) turns it into a
    TaskResult or releases the task with the reason, and deletes this row either way."""

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="received")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="received")
    received_file = models.CharField(max_length=300, help_text="the bytes as sent")
    update_hash = models.CharField(max_length=64, help_text="sha256 of the uploaded bytes")
    num_samples = models.PositiveIntegerField()
    metrics = models.JSONField(default=dict)
    # what the node says, capped by the time it held the lease when the bytes arrived
    compute_s = models.FloatField(default=0.0)
    received_at = models.DateTimeField(auto_now_add=True)
    # when its check was last enqueued, and how many times: a message lost with a killed
    # worker is enqueued again by the tick after STUCK_AGGREGATION_S (rounds.maintenance)
    check_enqueued_at = models.DateTimeField(default=timezone.now)
    checks = models.PositiveSmallIntegerField(default=1)


class RefusedUpdate(models.Model):
    """A node's received upload that ended without a result: the worker's check refused it,
    or its lease was released before the check (rounds.uploads.release_task). Kept per node,
    since the task itself forgets its node on release; the agent reads it back (GET
    agent/tasks/<id>/update) to tell its contributor why."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="refused")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="refused")
    update_hash = models.CharField(max_length=64, help_text="sha256 of the uploaded bytes")
    reason = models.CharField(max_length=300)
    refused_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["node", "task"])]


class ReceivedPartial(models.Model):
    """A zone aggregator's partial the web process took in but has not checked (issue 36,
    as ReceivedUpdate for a flat upload): the worker (rounds.zone_checks) decodes it against
    the round's model and stores it as a ZonePartial with its members' results, or refuses
    it and releases its members with the reason in their last_error; either way this row
    goes. Its members' tasks stay leased, in flight, while it waits."""

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="received_partials")
    aggregator = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+")
    received_file = models.CharField(max_length=300, help_text="the bytes as sent")
    update_hash = models.CharField(max_length=64, help_text="sha256 of the uploaded bytes")
    size = models.PositiveBigIntegerField(default=0, help_text="bytes uploaded")
    members = models.JSONField(default=list, help_text="the member task ids its manifest names")
    received_at = models.DateTimeField(auto_now_add=True)
    # when its check was last enqueued, and how many times (as ReceivedUpdate's)
    check_enqueued_at = models.DateTimeField(default=timezone.now)
    checks = models.PositiveSmallIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["round", "update_hash"], name="received_partial_once")
        ]


class ModelCopy(models.Model):
    """The version of a job's model a node holds, as far as the server knows: the last one it
    fetched or trained on. A claim sends that node a delta against it (rounds.delivery)."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="model_copies")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="model_copies")
    round_number = models.PositiveIntegerField()
    model_hash = models.CharField(max_length=64)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job"], name="model_copy_one_per_node_job")
        ]


class ShardCopy(models.Model):
    """A shard a node has downloaded: its claims prefer tasks on shards it holds, which its
    input cache serves without a download."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="shard_copies")
    shard = models.ForeignKey(Shard, on_delete=models.CASCADE, related_name="copies")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "shard"], name="shard_copy_unique")]


# secure aggregation's models live beside these (their module names the one feature)
from marketplace.rounds.secagg_models import (  # noqa: E402, F401
    SecAggMember,
    SecAggRound,
    SecAggShare,
)
