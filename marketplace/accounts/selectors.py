"""Reads for accounts."""

from __future__ import annotations

from django.db.models import QuerySet

from marketplace.accounts import keys
from marketplace.accounts.models import ApiKey, User


def active_key(plaintext: str) -> ApiKey | None:
    """The live key with this plaintext, with its user and node loaded, or None."""
    if not plaintext.startswith((keys.USER_PREFIX, keys.NODE_PREFIX)):
        return None
    return (
        ApiKey.objects.select_related("user", "node")
        .filter(digest=keys.digest(plaintext), revoked_at__isnull=True, user__is_active=True)
        .first()
    )


def user_keys(user: User) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(user=user, node__isnull=True).order_by("-created_at")
