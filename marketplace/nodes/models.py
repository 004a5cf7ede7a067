"""Contributor nodes: hardware, benchmark, price, liveness and reliability."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from marketplace.nodes.bounds import MAX_MEMORY_GB


class NodeKind(models.TextChoices):
    VOLUNTEER = "volunteer"
    PLATFORM = "platform"


class NodeState(models.TextChoices):
    IDLE = "idle"
    WORKING = "working"
    PAUSED = "paused"  # by its owner
    WAITING = "waiting"  # its work policy says not now; `state_reason` says why
    OFFLINE = "offline"


class EnrollmentToken(models.Model):
    """An operator's permission to enroll platform nodes (docs/operations.md): shown once as
    plaintext, stored as its sha256 only, good for `uses_left` registrations until it
    expires or is revoked. A provider's registration without one is always a volunteer's."""

    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16, help_text="first characters, to recognise it")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", help_text="the operator; empty when made on the command line",
    )  # fmt: skip
    memo = models.CharField(max_length=200, blank=True)
    uses_left = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.uses_left} left)"


class Node(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="nodes"
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=NodeKind.choices, default=NodeKind.VOLUNTEER)
    hardware = models.JSONField(default=dict)
    # its training runtime (docs/runtime-packs.md): {"plan": "cuda12", "torch": "2.13.0",
    # "cuda": "12.8", "source": "pack"}; {} from an agent that never said
    runtime = models.JSONField(default=dict, blank=True)
    benchmark = models.JSONField(default=dict)
    network = models.JSONField(default=dict)
    availability = models.JSONField(default=dict)
    price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4)
    # named local datasets (federated silos) this node can train on without uploading them
    local_datasets = models.JSONField(default=list, blank=True)
    # the rows it declared for each of them (name -> rows): a federated update's sample
    # count, its weight in the average, is checked against this; null (a node registered
    # before rows were declared) is no rows, and such a node's federated updates are refused
    local_dataset_rows = models.JSONField(default=dict, blank=True, null=True)
    # what the agent read of each (name -> {content_hash, kind, input_shape, num_classes,
    # columns, classes}; desktop/local_datasets.py): a silo trains a federated job only
    # when this schema fits the job's model (rounds.lifecycle.silo_fits); never a row
    local_dataset_schemas = models.JSONField(default=dict, blank=True)
    # the region the node declares itself in (`gpuflex-node run --zone`): a job with
    # `aggregation.hierarchy: zones` routes its updates through the zone's aggregator
    zone = models.CharField(max_length=64, blank=True, default="")
    # a platform node that serves its zone as aggregator: where members upload (the agent's
    # zone endpoint, desktop/zone_server.py); "" for every other node
    zone_url = models.CharField(max_length=300, blank=True, default="")
    # the operator's token a platform node was enrolled with (None: a volunteer, or set in
    # the admin)
    enrolled_with = models.ForeignKey(
        EnrollmentToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    # denormalised from `hardware` so that scheduling filters in SQL
    gpu_model = models.CharField(max_length=100, blank=True)
    memory_gb = models.FloatField(default=0.0)

    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.IDLE)
    # why a node is paused or waiting, in the agent's words ("another program uses the GPU
    # (game.exe)"), so that a buyer whose job stalls can see why
    state_reason = models.CharField(max_length=200, blank=True, default="")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    live_network = models.JSONField(default=dict, blank=True)

    # verification record: results that agreed / disagreed with their replicas; lost leases
    verified_ok = models.PositiveIntegerField(default=0)
    verified_bad = models.PositiveIntegerField(default=0)
    lost_leases = models.PositiveIntegerField(default=0)
    # tasks settled while its benchmark was flagged as inflated (`speed_flag`,
    # ledger/speed.py): each costs reliability like a lost lease
    speed_mismatches = models.PositiveIntegerField(default=0)
    reliability = models.FloatField(default=0.5)
    # its one speed (ledger/speed.py, docs/money.md "Speed"), in fp32 TFLOP/s: the figure
    # sharding, sizing, the lease's reservation and billing all read (selectors.speed_of);
    # null until a task of it was observed (its benchmark, the prior, stands until then).
    # Written when its results are settled, never on the claim or heartbeat paths.
    speed_tflops = models.FloatField(null=True, blank=True)
    # what its tasks show alone: the (log-space) mean of their observations, and how many
    speed_observed_tflops = models.FloatField(null=True, blank=True)
    speed_tasks = models.PositiveIntegerField(default=0)
    # why its benchmark is not trusted (its tasks show far less); "" while it is
    speed_flag = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["state", "last_heartbeat_at"])]
        # the database holds the line for the figures scheduling and the market sum: NaN and
        # infinities fail these comparisons (PostgreSQL sorts NaN above every number)
        constraints = [
            models.CheckConstraint(
                condition=Q(memory_gb__gte=0) & Q(memory_gb__lte=MAX_MEMORY_GB),
                name="node_memory_gb_bounded",
            ),
            models.CheckConstraint(
                condition=Q(reliability__gte=0) & Q(reliability__lte=1),
                name="node_reliability_unit",
            ),
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gte=0), name="node_price_not_negative"
            ),
            models.CheckConstraint(condition=Q(kind__in=NodeKind.values), name="node_kind_known"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def is_platform(self) -> bool:
        return self.kind == NodeKind.PLATFORM


def reliability_score(
    verified_ok: int, verified_bad: int, lost_leases: int, speed_mismatches: int = 0
) -> float:
    """A smoothed success rate: new nodes start at 0.5, a wrong result costs three good ones,
    a lost lease (silence past its timeout) one, and so does a task that showed the node's
    benchmark inflated."""
    misses = lost_leases + speed_mismatches
    return (verified_ok + 1) / (verified_ok + 3 * verified_bad + misses + 2)


class NodeTraffic(models.Model):
    """What the server itself moved for one node on one job, in payload bytes: counted by the
    agent endpoints as they send models and shards (down) and receive update bodies (up).
    One row per (node, job), bumped with an F() update (services.count_traffic)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="traffic")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="traffic")
    bytes_down = models.PositiveBigIntegerField(default=0)  # models and shards sent to the node
    bytes_up = models.PositiveBigIntegerField(default=0)  # update bodies received from it

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job"], name="node_traffic_unique_job")
        ]
