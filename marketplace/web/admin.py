"""Django admin for what the web pages do not cover (used when django.contrib.admin is
installed). Registered here only for models nobody else has registered (marketplace.rounds
registers its own)."""

# ruff: noqa: RUF012 - Django declares admin options as class attributes

from __future__ import annotations

from django.contrib import admin

from marketplace.accounts.models import ApiKey, User
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node


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


for model, model_admin in [
    (User, UserAdmin),
    (ApiKey, ApiKeyAdmin),
    (Node, NodeAdmin),
    (Job, JobAdmin),
]:
    if not admin.site.is_registered(model):
        admin.site.register(model, model_admin)
