"""Secure aggregation's agent messages (docs/agent-api.md, "Secure aggregation")."""

from __future__ import annotations

from rest_framework import serializers

from marketplace.api.serializers import numbers


class KeysSerializer(serializers.Serializer):
    c_key = serializers.CharField(max_length=64, help_text="X25519 public key (hex), shares")
    s_key = serializers.CharField(max_length=64, help_text="X25519 public key (hex), masks")


class SharesSerializer(serializers.Serializer):
    # round 1: recipient index -> sealed shares (hex); round 3: node index -> [kind, share hex]
    shares = serializers.DictField(child=serializers.JSONField(), allow_empty=False)


class SecAggRoundSerializer(serializers.Serializer):
    phase = serializers.CharField()
    index = numbers.IntegerField(allow_null=True)
    threshold = numbers.IntegerField(required=False)
    context = serializers.CharField(required=False)
    members = serializers.ListField(child=serializers.DictField(), required=False)
    shared = serializers.ListField(child=numbers.IntegerField(), required=False)
    survivors = serializers.ListField(child=numbers.IntegerField(), required=False)
    dropped = serializers.ListField(child=numbers.IntegerField(), required=False)
