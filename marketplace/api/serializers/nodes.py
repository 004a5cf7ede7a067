# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace.api.serializers import numbers
from marketplace.api.serializers.node_data import (
    AvailabilitySerializer,
    BenchmarkSerializer,
    HardwareSerializer,
    LocalDatasetSerializer,
    NetworkSerializer,
    RuntimeSerializer,
)
from marketplace.nodes.bounds import MAX_LOCAL_DATASETS
from marketplace.nodes.enrollment import MAX_TOKEN_LENGTH
from marketplace.nodes.models import Node, NodeKind
from marketplace.nodes.selectors import speed_summary

ZONE_PATTERN = r"^[A-Za-z0-9._-]+$"


def local_datasets_field() -> serializers.ListField:
    return serializers.ListField(
        child=LocalDatasetSerializer(), required=False, default=list,
        max_length=MAX_LOCAL_DATASETS,
        help_text='federated silos held here: [{"name": "clinic", "rows": 1437, '
        '"content_hash": "…", "kind": "csv", "input_shape": [64], "num_classes": 10}]',
    )  # fmt: skip


def once_each(value: list[dict]) -> list[dict]:
    names = [d["name"] for d in value]
    if len(set(names)) != len(names):
        raise serializers.ValidationError("Each dataset is declared once.")
    return [dict(d) for d in value]  # plain dicts for the JSON columns


class LocalDatasetsSerializer(serializers.Serializer):
    """`PUT agent/datasets`: every local dataset the node holds now (docs/agent-api.md)."""

    local_datasets = local_datasets_field()

    def validate_local_datasets(self, value: list[dict]) -> list[dict]:
        return once_each(value)


class NodeRegisterSerializer(serializers.Serializer):
    """docs/agent-api.md, "Registration": every object typed and bounded (node_data)."""

    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(
        choices=NodeKind.choices, required=False, default=NodeKind.VOLUNTEER,
        help_text="'platform' needs an operator's `enrollment_token` (403 without one)",
    )  # fmt: skip
    enrollment_token = serializers.CharField(
        required=False, allow_blank=True, write_only=True, max_length=MAX_TOKEN_LENGTH,
        help_text="an operator's platform enrollment token (gfx_e_…); volunteers leave it out",
    )  # fmt: skip
    hardware = HardwareSerializer()
    runtime = RuntimeSerializer(
        required=False, default=dict,
        help_text="the training runtime: plan class, torch and CUDA versions (runtime packs)",
    )  # fmt: skip
    benchmark = BenchmarkSerializer(required=False, default=dict)
    network = NetworkSerializer(required=False, default=dict)
    price_per_gpu_hour = numbers.DecimalField(
        max_digits=10, decimal_places=4, min_value=Decimal("0")
    )
    availability = AvailabilitySerializer(required=False, default=dict)
    local_datasets = local_datasets_field()
    zone = serializers.RegexField(
        ZONE_PATTERN, required=False, allow_blank=True, default="", max_length=64,
        help_text="the region the node is in (letters, digits, '.', '_', '-'): jobs with "
        "aggregation.hierarchy zones route its updates through the zone's aggregator",
    )  # fmt: skip
    zone_url = serializers.URLField(
        required=False, allow_blank=True, default="", max_length=300,
        help_text="platform nodes only: the http(s) address of the zone endpoint the agent "
        "serves, making it its zone's aggregator (needs a zone)",
    )  # fmt: skip

    def validate_local_datasets(self, value: list[dict]) -> list[dict]:
        return once_each(value)

    def validate(self, attrs: dict) -> dict:
        if attrs.get("zone_url"):
            if attrs.get("kind") != NodeKind.PLATFORM:
                raise serializers.ValidationError(
                    {"zone_url": "only a platform node can be its zone's aggregator"}
                )
            if not attrs.get("zone"):
                raise serializers.ValidationError({"zone_url": "an aggregator needs a zone"})
        return attrs

    def to_internal_value(self, data: object) -> dict:
        out = super().to_internal_value(data)
        # plain dicts for the JSON columns (DRF hands back OrderedDicts)
        for key in ("hardware", "runtime", "benchmark", "network", "availability"):
            out[key] = _plain(out.get(key) or {})
        out["local_datasets"] = [dict(d) for d in out.get("local_datasets", [])]
        return out


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class EnrollmentTokenRequestSerializer(serializers.Serializer):
    uses = numbers.IntegerField(required=False, default=1, min_value=1, max_value=1000)
    expires_in_s = numbers.IntegerField(
        required=False, allow_null=True, default=None, min_value=60, max_value=365 * 86400,
        help_text="seconds until the token expires; null: never",
    )  # fmt: skip
    memo = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)


class EnrollmentTokenSerializer(serializers.Serializer):
    id = numbers.IntegerField()
    prefix = serializers.CharField()
    uses_left = numbers.IntegerField()
    expires_at = serializers.DateTimeField(allow_null=True)
    memo = serializers.CharField()
    created_at = serializers.DateTimeField()
    enrollment_token = serializers.CharField(help_text="shown only this once")


class NodeSpeedSerializer(serializers.Serializer):
    """The node's one speed figure beside what it advertises (docs/money.md, "Speed")."""

    advertised_tflops = serializers.FloatField(allow_null=True, help_text="its benchmark")
    speed_tflops = serializers.FloatField(
        allow_null=True, help_text="THE figure sharding, sizing and billing use"
    )
    observed_tflops = serializers.FloatField(
        allow_null=True, help_text="what its tasks show alone; null before any was observed"
    )
    tasks = numbers.IntegerField(help_text="tasks observed")
    flagged = serializers.BooleanField(help_text="its benchmark is not trusted")
    note = serializers.CharField(help_text="why it is flagged")


class NodeSerializer(serializers.ModelSerializer):
    speed = serializers.SerializerMethodField(
        help_text="its one speed figure against its advertised benchmark (NodeSpeedSerializer)"
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "kind",
            "hardware",
            "runtime",
            "benchmark",
            "network",
            "availability",
            "price_per_gpu_hour",
            "local_datasets",
            "local_dataset_rows",
            "local_dataset_schemas",
            "zone",
            "zone_url",
            "gpu_model",
            "memory_gb",
            "state",
            "last_heartbeat_at",
            "metrics",
            "live_network",
            "reliability",
            "verified_ok",
            "verified_bad",
            "lost_leases",
            "speed_mismatches",
            "speed",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(NodeSpeedSerializer)
    def get_speed(self, node: Node) -> dict:
        return speed_summary(node)


class NodeCreatedSerializer(NodeSerializer):
    node_key = serializers.CharField(help_text="shown only this once")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "node_key"]
        read_only_fields = fields
