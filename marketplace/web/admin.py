"""Django admin for what the web pages do not cover (used when django.contrib.admin is
installed). Registered here only for models nobody else has registered (marketplace.rounds
registers its own)."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.accounts.models import ApiKey, User
from marketplace.jobs.models import Job, ModelExport, Shard
from marketplace.nodes.models import Node
from marketplace.sweeps.models import SweepTrial
from marketplace.uploads.models import Upload
from marketplace.web.readonly_admin import ReadOnlyAdmin

# The models deliberately left out of the admin, and why (tests/marketplace/test_admin.py
# checks every other model is registered): a secure-aggregation round's key exchange is the
# protocol's alone, its public keys and sealed shares mean nothing to an operator, and
# SecAggRound (registered, rounds/admin.py) shows the round's phase and survivors.
NOT_IN_ADMIN = {
    "rounds.SecAggMember": "a secure-aggregation member's public keys: protocol data only",
    "rounds.SecAggShare": "sealed secret shares between members: unreadable, protocol only",
}


class UserAdmin(admin.ModelAdmin):
    list_display = ["username", "email", "role", "is_active", "date_joined"]
    list_filter = ["role", "is_active"]
    search_fields = ["username", "email"]


class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "node", "name", "created_at", "revoked_at"]
    readonly_fields = ["digest", "prefix"]


class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "kind", "gpu_model", "state", "price_per_gpu_hour",
                    "reliability", "last_heartbeat_at"]  # fmt: skip
    list_filter = ["kind", "state"]
    search_fields = ["name", "gpu_model", "owner__username"]


class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "buyer", "status", "tier", "rounds_done", "budget", "created_at"]
    list_filter = ["status", "tier"]
    search_fields = ["name", "buyer__username"]


# made by the system from a job (its shards), a chunked upload's progress and a sweep's
# trials: read-only, their state moves only through the services
class ShardAdmin(ReadOnlyAdmin):
    list_display = ["job", "generation", "index", "size", "content_hash"]
    list_select_related = ["job"]


class UploadAdmin(ReadOnlyAdmin):
    list_display = ["filename", "owner", "status", "size", "received", "job", "created_at"]
    list_filter = ["status"]
    list_select_related = ["owner", "job"]
    search_fields = ["filename", "owner__username", "sha256"]


class ModelExportAdmin(ReadOnlyAdmin):
    list_display = ["job", "format", "status", "model_hash", "requested_at", "starts", "error"]
    list_filter = ["format", "status"]
    list_select_related = ["job"]


class SweepTrialAdmin(ReadOnlyAdmin):
    list_display = ["sweep", "number", "job", "state", "value", "updated_at"]
    list_filter = ["state"]
    list_select_related = ["sweep", "job"]


for model, model_admin in [
    (User, UserAdmin),
    (ApiKey, ApiKeyAdmin),
    (Node, NodeAdmin),
    (Job, JobAdmin),
    (Shard, ShardAdmin),
    (ModelExport, ModelExportAdmin),
    (Upload, UploadAdmin),
    (SweepTrial, SweepTrialAdmin),
]:
    if not admin.site.is_registered(model):
        admin.site.register(model, model_admin)
