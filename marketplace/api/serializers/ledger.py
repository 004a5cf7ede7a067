# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from rest_framework import serializers

from marketplace.ledger.models import Entry, Payout


class AmountField(serializers.CharField):
    """Money travels as decimal strings; the ledger parses and checks them (never floats)."""

    def to_internal_value(self, data: object) -> str:
        if isinstance(data, float):
            raise serializers.ValidationError("give money as a decimal string, not a number")
        return super().to_internal_value(str(data) if isinstance(data, int) else data)


class PayoutRequestSerializer(serializers.Serializer):
    amount = AmountField(max_length=30)
    wallet_address = serializers.CharField(max_length=42)
    idempotency_key = serializers.CharField(
        max_length=100,
        required=False,
        help_text="or the Idempotency-Key header; a retry with the same key never pays twice",
    )


class PayoutSerializer(serializers.ModelSerializer):
    batch_id = serializers.CharField(
        source="batch.batch_id", default=None, read_only=True, allow_null=True
    )

    class Meta:
        model = Payout
        fields = [
            "id",
            "amount",
            "wallet_address",
            "status",
            "reference",
            "batch_id",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class EntrySerializer(serializers.ModelSerializer):
    kind = serializers.CharField(source="transaction.kind")
    memo = serializers.CharField(source="transaction.memo")
    account = serializers.CharField(source="account.code")
    job = serializers.UUIDField(source="transaction.job_id", allow_null=True)
    created_at = serializers.DateTimeField(source="transaction.created_at")

    class Meta:
        model = Entry
        fields = ["account", "amount", "kind", "memo", "job", "created_at"]
        read_only_fields = fields


class GrantSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    amount = AmountField(max_length=30)
    memo = serializers.CharField(max_length=300, required=False, default="operator grant")
    idempotency_key = serializers.CharField(max_length=100, required=False)


class WalletSerializer(serializers.Serializer):
    address = serializers.RegexField(r"^0x[0-9a-fA-F]{40}$", max_length=42)


class ReferenceSerializer(serializers.Serializer):
    reference = serializers.CharField(max_length=200)
