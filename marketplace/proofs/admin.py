"""Django admin for segment checks (used when django.contrib.admin is installed): read-only,
their verdicts are the worker's."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.proofs.models import SegmentCheck
from marketplace.web.readonly_admin import ReadOnlyAdmin


class SegmentCheckAdmin(ReadOnlyAdmin):
    list_display = ["id", "node", "segment", "status", "distance", "tolerance", "rerun_steps",
                    "task_steps", "created_at"]  # fmt: skip
    list_filter = ["status"]


if not admin.site.is_registered(SegmentCheck):
    admin.site.register(SegmentCheck, SegmentCheckAdmin)
