"""Django admin for the ledger: every model, read-only. Credit moves only through the ledger's
services (balanced, idempotent transactions; docs/money.md), never by an edit in the admin, so
nobody (a superuser included) may add, change or delete a row here."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.ledger.models import (
    Account,
    ChainDeposit,
    EarningsHold,
    Entry,
    EscrowFloor,
    NodeRegistration,
    Payout,
    ProvenanceAnchor,
    Reservation,
    SettlementRecord,
    Transaction,
    WalletAddress,
)
from marketplace.web.readonly_admin import ReadOnlyAdmin, ReadOnlyInline


class EntryInline(ReadOnlyInline):
    model = Entry
    fields = ["account", "amount"]
    readonly_fields = ["account", "amount"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["code", "kind", "user", "job", "created_at"]
    list_filter = ["kind"]
    list_select_related = ["user", "job"]
    search_fields = ["code", "user__username"]


@admin.register(Transaction)
class TransactionAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "memo", "job", "node", "actor", "settlement", "created_at"]
    list_filter = ["kind"]
    list_select_related = ["job", "node", "actor", "settlement"]
    search_fields = ["key", "memo"]
    inlines = [EntryInline]


@admin.register(Entry)
class EntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "transaction", "account", "amount"]
    list_select_related = ["transaction", "account"]
    search_fields = ["account__code"]


@admin.register(Payout)
class PayoutAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "user", "amount", "status", "batch", "created_at"]
    list_filter = ["kind", "status"]
    list_select_related = ["user", "batch"]
    search_fields = ["user__username", "reference"]


@admin.register(ChainDeposit)
class ChainDepositAdmin(ReadOnlyAdmin):
    list_display = ["id", "user", "amount", "token", "block_number", "created_at"]
    list_select_related = ["user"]


@admin.register(SettlementRecord)
class SettlementRecordAdmin(ReadOnlyAdmin):
    list_display = ["batch_id", "total_units", "posted", "failed", "anchored", "closed_reason"]
    list_filter = ["posted", "failed", "anchored"]


@admin.register(ProvenanceAnchor)
class ProvenanceAnchorAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "round", "anchored", "failed", "created_at", "anchored_at"]
    list_filter = ["anchored", "failed"]
    list_select_related = ["job"]


@admin.register(WalletAddress)
class WalletAddressAdmin(ReadOnlyAdmin):
    list_display = ["user", "address"]
    list_select_related = ["user"]
    search_fields = ["user__username", "address"]


@admin.register(EscrowFloor)
class EscrowFloorAdmin(ReadOnlyAdmin):
    list_display = ["job", "free", "entries"]
    list_select_related = ["job"]


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "node", "amount", "seconds", "state", "created_at", "closed_at"]
    list_filter = ["state"]
    list_select_related = ["job", "node"]


@admin.register(EarningsHold)
class EarningsHoldAdmin(ReadOnlyAdmin):
    list_display = ["id", "node", "user", "job", "amount", "until", "state", "created_at"]
    list_filter = ["state"]
    list_select_related = ["node", "user", "job"]


@admin.register(NodeRegistration)
class NodeRegistrationAdmin(ReadOnlyAdmin):
    list_display = ["user", "address", "registered", "failed", "created_at"]
    list_filter = ["registered", "failed"]
    list_select_related = ["user"]
