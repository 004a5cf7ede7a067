"""Jobs and their shards; their rounds, tasks and results are marketplace.rounds.models."""

# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

import uuid
from decimal import Decimal
from functools import cached_property

from django.conf import settings
from django.db import models

from trainer.spec import JobSpec, parse_spec


class Tier(models.TextChoices):
    VOLUNTEER = "volunteer"  # cheapest; every result can be checked by redundancy
    HYBRID = "hybrid"
    PLATFORM = "platform"  # platform-owned nodes only; trusted, never replicated


class JobStatus(models.TextChoices):
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"  # ended early, with the reason in `error` (its budget ran out)


# a job in these may still change; in any other it has ended
ACTIVE_STATUSES = (JobStatus.RUNNING, JobStatus.PAUSED)


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    buyer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="trainer.spec.JobSpec.to_dict()")
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.HYBRID)
    budget = models.DecimalField(max_digits=12, decimal_places=4, default=Decimal("0"))
    max_price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.RUNNING)
    # "" for built-in datasets; else the uploaded file in storage
    dataset_file = models.CharField(max_length=300, blank=True)
    # federated mode: the named local dataset nodes train on (their data never leaves them);
    # the job's own dataset is then only the held-out evaluation split
    federated_dataset = models.CharField(max_length=100, blank=True)
    input_shape = models.JSONField(default=list)
    num_classes = models.PositiveIntegerField(default=0)
    task_kind = models.CharField(max_length=32, default="classification")
    min_memory_gb = models.FloatField(default=0.0)
    # the spec's hardware requirements, as columns the scheduling rule reads (planning.
    # may_work_on); min_memory_gb above is the spec's or the model's estimate, the larger
    min_vram_gb = models.FloatField(default=0.0)
    min_fp32_tflops = models.FloatField(default=0.0)
    gpu_required = models.BooleanField(default=False)
    # the spec's requirements.isolation == "full": only nodes whose sandbox confines a task
    isolation_full = models.BooleanField(default=False)
    # the node's training runtime (docs/runtime-packs.md): bf16/fp16 precision needs a GPU
    # runtime (JobSpec.needs_gpu_runtime), and the spec's runtime.min_torch ("" none)
    gpu_runtime_required = models.BooleanField(default=False)
    min_torch = models.CharField(max_length=16, blank=True, default="")
    # trainer.fit.Footprint of the model: sent with each task for the agent's fit check
    footprint = models.JSONField(default=dict, blank=True)
    proximal_mu = models.FloatField(default=0.0)
    # adaptive jobs: each node's tier as the policy last classed it (trainer.adapt
    # PolicyState), so a node excluded for poor health comes back only past the hysteresis
    policy_tiers = models.JSONField(default=dict, blank=True)
    rounds_done = models.PositiveIntegerField(default=0)
    reached_target = models.BooleanField(default=False)
    # ε spent so far by a job that promises differential privacy (jobs/privacy.py)
    privacy_epsilon_spent = models.FloatField(null=True, blank=True)
    model_hash = models.CharField(max_length=64, blank=True)
    model_file = models.CharField(max_length=300, blank=True)
    error = models.TextField(blank=True)
    # why the job ended: its target reached, max_rounds run, a plateau (rounds.early_stopping,
    # trainer.schedule.plateau_reason) or its budget; "" while it runs
    stop_reason = models.CharField(max_length=300, blank=True)
    # a sweep's trial: the sweep job whose escrow funds it (marketplace/sweeps/)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # when its working files were deleted (marketplace/rounds/retention.py)
    files_pruned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["buyer", "created_at"]), models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @cached_property
    def parsed_spec(self) -> JobSpec:
        """The job's spec, parsed once per instance; every rule reads the spec through this
        (the JSON in `spec` was validated at submission and never changes)."""
        return parse_spec(self.spec)

    @property
    def kind(self) -> str:
        """ "train", a scoring job's "evaluate" / "inference" (one round, no training), or
        "sweep" (no rounds of its own: its trials are child training jobs)."""
        return self.parsed_spec.kind

    @property
    def max_rounds(self) -> int:
        """A scoring job makes one pass: one round, whatever `rounds.max_rounds` says."""
        spec = self.parsed_spec
        return 1 if spec.scoring else spec.rounds.max_rounds

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_federated(self) -> bool:
        return bool(self.federated_dataset)


class Shard(models.Model):
    """One cut of a job's training split. Generation 0 is cut at submission; elastic jobs
    re-cut the split at round boundaries as a new generation (marketplace.rounds.resharding),
    and keep the older ones: earlier rounds' tasks, verification and provenance name them."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shards")
    generation = models.PositiveIntegerField(default=0)
    index = models.PositiveIntegerField()
    file = models.CharField(max_length=300)
    content_hash = models.CharField(max_length=64)
    size = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "generation", "index"], name="shard_unique_index"
            )
        ]


class ExportStatus(models.TextChoices):
    PENDING = "pending"  # asked for; a worker makes it (jobs/export_making.py)
    DONE = "done"  # in storage, exports/{model_hash}{suffix} beside the job's models
    FAILED = "failed"  # the model cannot be exported to this format: `error` says why


class ModelExport(models.Model):
    """A buyer's request for the job's model in an export format the worker makes (onnx,
    torchscript, hf: they build the model with torch, which the web process never imports).
    One row per job and format, for the model whose hash it names: a newer model resets it.
    The record makes the request idempotent (a second request while it is being made sends
    nothing) and lets the next request tell the buyer why an export failed."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="exports")
    format = models.CharField(max_length=16)
    model_hash = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=ExportStatus.choices, default=ExportStatus.PENDING
    )
    error = models.TextField(blank=True)
    # when a message was last sent: a request long after it sends another (a lost message)
    requested_at = models.DateTimeField()
    # how many times a worker began making it: a worker that dies mid-export (out of memory)
    # has its message redelivered, and a few such starts fail the export instead of looping
    starts = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "format"], name="model_export_unique_format")
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.format} {self.model_hash[:12]} {self.status}"
