"""Reads for accounts."""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import QuerySet

from marketplace.accounts import key_cache, keys
from marketplace.accounts.models import ApiKey, User


def active_key(
    plaintext: str, *, before_database: Callable[[], None] | None = None
) -> ApiKey | None:
    """The live key with this plaintext, or None. From the key cache where there is one
    (key_cache.py: its user and node are then loaded when first used), else from the
    database with its user and node, calling `before_database` first (the authentication's
    failure throttle, which may refuse: a guessed key is never in the cache)."""
    if not plaintext.startswith((keys.USER_PREFIX, keys.NODE_PREFIX)):
        if before_database is not None:
            before_database()
        return None
    digest = keys.digest(plaintext)
    cached, may_store = key_cache.lookup(digest)
    if cached is not None:
        return cached
    if before_database is not None:
        before_database()
    key = (
        ApiKey.objects.select_related("user", "node")
        .filter(digest=digest, revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if key is not None and may_store:
        key_cache.store(key)
    return key


def user_keys(user: User) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(user=user, node__isnull=True).order_by("-created_at")
