"""Django admin for enrollment tokens (used when django.contrib.admin is installed): an
operator sees and revokes them here; tokens are made with `create_enrollment_token` or
`POST /api/v1/operator/enrollment-tokens`, which show the plaintext once."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.nodes.models import EnrollmentToken, NodeTraffic
from marketplace.web.readonly_admin import ReadOnlyAdmin


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "memo", "uses_left", "expires_at", "revoked_at", "created_by"]
    readonly_fields = ["digest", "prefix", "created_by", "created_at"]


@admin.register(NodeTraffic)
class NodeTrafficAdmin(ReadOnlyAdmin):
    list_display = ["node", "job", "bytes_down", "bytes_up"]
    list_select_related = ["node", "job"]
