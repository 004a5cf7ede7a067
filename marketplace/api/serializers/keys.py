# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from rest_framework import serializers

from marketplace.accounts.models import ApiKey


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "created_at", "revoked_at"]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="shown only this once")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields
