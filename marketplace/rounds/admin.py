"""Django admin for rounds, tasks and their results (used when django.contrib.admin is
installed)."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.rounds.models import (
    ModelCopy,
    ReceivedPartial,
    ReceivedUpdate,
    RefusedUpdate,
    Round,
    SecAggRound,
    ShardCopy,
    Task,
    TaskResult,
    ZonePartial,
)
from marketplace.web.readonly_admin import ReadOnlyAdmin


class RoundAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "status", "opened_at", "closed_at"]
    list_filter = ["status"]


class TaskAdmin(admin.ModelAdmin):
    list_display = ["id", "round", "replica", "status", "node", "attempts", "leased_at"]
    list_filter = ["status"]


class TaskResultAdmin(admin.ModelAdmin):
    list_display = ["task", "node", "accepted", "verified", "credited", "compute_s"]
    list_filter = ["accepted", "verified", "credited"]


# derived by the protocol (zone aggregators' partial sums, which node holds which model and
# shard, a secure-aggregation round's phase): shown for diagnosis, never edited by hand
class ZonePartialAdmin(ReadOnlyAdmin):
    list_display = ["round", "zone", "aggregator", "num_samples", "size", "created_at"]
    list_select_related = ["round", "aggregator"]


class ModelCopyAdmin(ReadOnlyAdmin):
    list_display = ["node", "job", "round_number", "updated_at"]
    list_select_related = ["node", "job"]


class ShardCopyAdmin(ReadOnlyAdmin):
    list_display = ["node", "shard", "created_at"]
    list_select_related = ["node", "shard"]


# an upload the web process took in and the worker has yet to check (rounds.update_checks)
class ReceivedUpdateAdmin(ReadOnlyAdmin):
    list_display = ["task", "node", "update_hash", "num_samples", "compute_s", "received_at",
                    "checks", "check_enqueued_at"]  # fmt: skip
    list_select_related = ["task", "node"]


# a node's received upload that ended without a result, and why (what the agent reads back)
class RefusedUpdateAdmin(ReadOnlyAdmin):
    list_display = ["task", "node", "reason", "refused_at"]
    list_select_related = ["task", "node"]


# a zone aggregator's partial waiting for the worker's check (rounds.zone_checks)
class ReceivedPartialAdmin(ReadOnlyAdmin):
    list_display = ["round", "aggregator", "update_hash", "size", "received_at"]
    list_select_related = ["round", "aggregator"]


class SecAggRoundAdmin(ReadOnlyAdmin):
    list_display = ["round", "phase", "phase_deadline", "threshold"]
    list_filter = ["phase"]
    list_select_related = ["round"]


for model, model_admin in [
    (Round, RoundAdmin),
    (Task, TaskAdmin),
    (TaskResult, TaskResultAdmin),
    (ZonePartial, ZonePartialAdmin),
    (ModelCopy, ModelCopyAdmin),
    (ShardCopy, ShardCopyAdmin),
    (ReceivedUpdate, ReceivedUpdateAdmin),
    (ReceivedPartial, ReceivedPartialAdmin),
    (RefusedUpdate, RefusedUpdateAdmin),
    (SecAggRound, SecAggRoundAdmin),
]:
    if not admin.site.is_registered(model):
        admin.site.register(model, model_admin)
