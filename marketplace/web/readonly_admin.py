"""A Django admin that shows and never changes: for the ledger, where every credit moved is a
balanced, append-only transaction made by the ledger's services (docs/money.md), and for rows
the system derives (speeds, copies, trials). An operator reads them here; money moves only
through the services, which keep the books balanced and the chain in step."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class _NoChanges:
    """No add, change or delete, for anybody (a superuser included)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(_NoChanges, admin.ModelAdmin):
    """`_NoChanges`, and every field read-only."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in self.model._meta.get_fields() if field.concrete]


class ReadOnlyInline(_NoChanges, admin.TabularInline):
    extra = 0
    can_delete = False
