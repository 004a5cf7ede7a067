# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from marketplace.nodes.models import Node, NodeKind


class NodeRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=NodeKind.choices)
    hardware = serializers.DictField()
    benchmark = serializers.DictField(required=False, default=dict)
    network = serializers.DictField(required=False, default=dict)
    price_per_gpu_hour = serializers.DecimalField(
        max_digits=10, decimal_places=4, min_value=Decimal("0")
    )
    availability = serializers.DictField(required=False, default=dict)
    local_datasets = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, default=list
    )


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "kind",
            "hardware",
            "benchmark",
            "network",
            "availability",
            "price_per_gpu_hour",
            "local_datasets",
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
            "created_at",
        ]
        read_only_fields = fields


class NodeCreatedSerializer(NodeSerializer):
    node_key = serializers.CharField(help_text="shown only this once")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "node_key"]
        read_only_fields = fields
