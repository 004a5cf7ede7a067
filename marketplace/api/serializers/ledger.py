# ruff: noqa: RUF012 - Django/DRF declare Meta options and view settings as class attributes

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from marketplace.ledger.models import Entry, Payout
from marketplace.ledger.money import MAX_AMOUNT, parse_amount


class AmountField(serializers.CharField):
    """Money travels as decimal strings (never floats), parsed here by the ledger's one
    parser: bounded to what the ledger stores exactly, so a bad amount is a 400 naming the
    field before anything is written (parse_amount also refuses over 40 characters)."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault(
            "help_text", f"credits as a decimal string, at most {MAX_AMOUNT} and 6 places"
        )
        super().__init__(**kwargs)

    def to_internal_value(self, data: object) -> Decimal:
        if isinstance(data, float):
            raise serializers.ValidationError("give money as a decimal string, not a number")
        text = super().to_internal_value(str(data) if isinstance(data, int) else data)
        try:
            return parse_amount(text, field=self.field_name or "amount")
        except ValueError as exc:
            # parse_amount's message starts with the field name, which DRF adds itself
            raise serializers.ValidationError(str(exc).partition(": ")[2]) from None


class PayoutRequestSerializer(serializers.Serializer):
    amount = AmountField()
    wallet_address = serializers.CharField(max_length=42)
    idempotency_key = serializers.CharField(
        max_length=100,
        required=False,
        help_text="or the Idempotency-Key header; a retry with the same key never pays twice",
    )


class WithdrawalRequestSerializer(serializers.Serializer):
    amount = AmountField()
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
            "kind",
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
    amount = AmountField()
    memo = serializers.CharField(max_length=300, required=False, default="operator grant")
    idempotency_key = serializers.CharField(max_length=100, required=False)


class WalletSerializer(serializers.Serializer):
    address = serializers.RegexField(r"^0x[0-9a-fA-F]{40}$", max_length=42)


class ReferenceSerializer(serializers.Serializer):
    reference = serializers.CharField(max_length=200)
