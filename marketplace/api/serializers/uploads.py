# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from rest_framework import serializers

from marketplace.api.serializers import numbers
from marketplace.uploads.models import Upload


class UploadCreateSerializer(serializers.Serializer):
    filename = serializers.CharField(max_length=255, help_text="the file's name (no folders)")
    size = numbers.IntegerField(min_value=1, help_text="the file's size in bytes")
    sha256 = serializers.RegexField(
        r"^[0-9a-fA-F]{64}$", help_text="the file's SHA-256, 64 hex digits"
    )


class UploadSerializer(serializers.ModelSerializer):
    class Meta:
        model = Upload
        fields = [
            "id",
            "filename",
            "size",
            "sha256",
            "received",
            "status",
            "job",
            "created_at",
            "updated_at",
            "completed_at",
        ]
        read_only_fields = fields
