"""Django admin for rounds, tasks and their results (used when django.contrib.admin is
installed)."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.rounds.models import Round, Task, TaskResult


class RoundAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "status", "opened_at", "closed_at"]
    list_filter = ["status"]


class TaskAdmin(admin.ModelAdmin):
    list_display = ["id", "round", "replica", "status", "node", "attempts", "leased_at"]
    list_filter = ["status"]


class TaskResultAdmin(admin.ModelAdmin):
    list_display = ["task", "node", "accepted", "verified", "credited", "compute_s"]
    list_filter = ["accepted", "verified", "credited"]


for model, model_admin in [(Round, RoundAdmin), (Task, TaskAdmin), (TaskResult, TaskResultAdmin)]:
    if not admin.site.is_registered(model):
        admin.site.register(model, model_admin)
