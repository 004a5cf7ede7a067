# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace.api.serializers import numbers
from marketplace.jobs.models import Job, Tier
from marketplace.jobs.selectors import federated_status, node_states_of, scoring_result
from marketplace.ledger.selectors import job_costs
from marketplace.rounds.models import Round
from marketplace.sweeps.selectors import best_trial, trial_rows


class SpecField(serializers.JSONField):
    """An object (JSON bodies) or JSON / YAML text (multipart forms); parsed by the service,
    which reports problems with the spec's own field paths."""

    def to_internal_value(self, data: object) -> object:
        if isinstance(data, str | bytes | dict):
            return data
        return super().to_internal_value(data)


class JobSubmitSerializer(serializers.Serializer):
    spec = SpecField(help_text="the job spec: an object, or JSON/YAML text")
    dataset = serializers.FileField(required=False, allow_null=True, allow_empty_file=True)
    dataset_upload = serializers.UUIDField(
        required=False,
        allow_null=True,
        help_text="a finished chunked upload's id (POST /api/v1/uploads/), instead of "
        "`dataset`: for datasets larger than the inline limit",
    )
    model_config = serializers.FileField(
        required=False, allow_null=True, help_text="an hf_* model's config.json (model.config)"
    )
    model_checkpoint = serializers.FileField(
        required=False,
        allow_null=True,
        help_text="initial weights as safetensors (model.checkpoint); never a pickle",
    )
    model_program = serializers.FileField(
        required=False,
        allow_null=True,
        help_text="an exported model (model.program): a torch.export.save .pt2 archive, "
        "read as JSON and raw tensors, never unpickled",
    )
    dataset_tokenizer = serializers.FileField(
        required=False,
        allow_null=True,
        help_text="a text dataset's Hugging Face tokenizer.json (dataset.tokenizer); JSON only",
    )
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.HYBRID)
    budget = numbers.DecimalField(
        max_digits=12,
        decimal_places=4,
        min_value=Decimal("0.0001"),
        help_text="credits held in escrow from your balance while the job runs",
    )
    max_price_per_gpu_hour = numbers.DecimalField(
        max_digits=10,
        decimal_places=4,
        min_value=Decimal("0.0001"),
        required=False,
        allow_null=True,
        help_text="the most a node may ask per reference GPU-hour, more than 0; left out: the "
        "market's price, the median asking price of the online nodes that fit the job",
    )
    federated_dataset = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=100,
        help_text="train on nodes holding this named local dataset (federated mode)",
    )


class TrialSerializer(serializers.Serializer):
    """One trial of a sweep: a child training job with the sampled parameters."""

    number = numbers.IntegerField()
    job = serializers.UUIDField(allow_null=True, help_text="the trial's training job")
    params = serializers.DictField(help_text="the sampled parameters, by the space's names")
    state = serializers.CharField(help_text="running, completed, pruned or failed")
    rounds = numbers.IntegerField(help_text="rounds the trial's job has run")
    value = serializers.FloatField(allow_null=True, help_text="the objective, once completed")
    cost = serializers.CharField(help_text="credits spent on the trial's work")
    error = serializers.CharField(allow_blank=True)


class JobSerializer(serializers.ModelSerializer):
    max_rounds = numbers.IntegerField(read_only=True)
    current_round = serializers.SerializerMethodField()
    last_metrics = serializers.SerializerMethodField()
    costs = serializers.SerializerMethodField()
    privacy = serializers.SerializerMethodField()
    kind = serializers.CharField(read_only=True, help_text="train, evaluate, inference or sweep")
    trials = serializers.SerializerMethodField(
        help_text="a sweep's trials (number, job, params, state, rounds, value, cost); else null"
    )
    best_trial = serializers.SerializerMethodField(
        help_text="a sweep's best completed trial's number; else null"
    )
    parent = serializers.UUIDField(
        source="parent_id", read_only=True, allow_null=True,
        help_text="a sweep's trial: the sweep's id; else null",
    )  # fmt: skip
    result = serializers.SerializerMethodField(
        help_text="a finished scoring job's result: evaluate: accuracy, correct, total, loss "
        "(the mean), loss_sum; inference: rows and the predictions' URL (Parquet); else null"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "kind",
            "status",
            "tier",
            "budget",
            "max_price_per_gpu_hour",
            "federated_dataset",
            "spec",
            "rounds_done",
            "max_rounds",
            "current_round",
            "reached_target",
            "last_metrics",
            "result",
            "costs",
            "privacy",
            "model_hash",
            "error",
            "stop_reason",
            "parent",
            "trials",
            "best_trial",
            "created_at",
            "updated_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_current_round(self, job: Job) -> int | None:
        active = [r for r in job.rounds.all() if r.status in ("open", "aggregating")]
        return active[0].number if active else None

    def get_privacy(self, job: Job) -> dict | None:
        """A private job's promise and what it has spent: mode, clip_norm, noise_multiplier,
        the target epsilon and delta, and epsilon_spent after the rounds done (None before
        the first); null for a job without differential privacy."""
        from marketplace.jobs.privacy import privacy_summary

        return privacy_summary(job)

    def get_costs(self, job: Job) -> dict[str, str | int]:
        """Money as decimal strings: budget, held, spent (with fees, bonuses and the cost of
        redundancy shown apart), refunded."""
        return job_costs(job).to_dict()

    @extend_schema_field(TrialSerializer(many=True, allow_null=True))
    def get_trials(self, job: Job) -> list[dict] | None:
        return trial_rows(job) if job.kind == "sweep" else None

    @extend_schema_field(numbers.IntegerField(allow_null=True))
    def get_best_trial(self, job: Job) -> int | None:
        best = best_trial(job) if job.kind == "sweep" else None
        return best.number if best else None

    def get_result(self, job: Job) -> dict | None:
        return scoring_result(job)

    def get_last_metrics(self, job: Job) -> dict | None:
        done = [r for r in job.rounds.all() if r.status == "done"]
        return done[-1].metrics if done else None


class NodeReasonSerializer(serializers.Serializer):
    state = serializers.CharField()
    reason = serializers.CharField()
    nodes = numbers.IntegerField()


class NodeStatesSerializer(serializers.Serializer):
    nodes = numbers.IntegerField(help_text="online nodes that may take this job's tasks")
    counts = serializers.DictField(child=numbers.IntegerField(), help_text="by state")
    reasons = NodeReasonSerializer(many=True, help_text="why nodes wait or are paused")
    summary = serializers.CharField(help_text='e.g. "3 nodes waiting: another program uses '
                                    'the GPU (game.exe)"')  # fmt: skip


class FederatedStatusSerializer(serializers.Serializer):
    """A federated job's silos and how its updates are verified (null for other jobs)."""

    dataset = serializers.CharField()
    silos_online = numbers.IntegerField()
    silos_declared = numbers.IntegerField()
    summary = serializers.CharField()
    verification = serializers.CharField()


class JobDetailSerializer(JobSerializer):
    """One job, with the state of the nodes that could work on it (not in lists: a query per
    job)."""

    node_states = serializers.SerializerMethodField()
    federated = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "node_states", "federated"]
        read_only_fields = fields

    @extend_schema_field(NodeStatesSerializer)
    def get_node_states(self, job: Job) -> dict:
        return node_states_of(job)

    @extend_schema_field(FederatedStatusSerializer(allow_null=True))
    def get_federated(self, job: Job) -> dict | None:
        return federated_status(job)


class RoundSerializer(serializers.ModelSerializer):
    class Meta:
        model = Round
        fields = [
            "number",
            "status",
            "opened_at",
            "deadline",
            "closed_at",
            "input_model_hash",
            "metrics",
        ]
        read_only_fields = fields
