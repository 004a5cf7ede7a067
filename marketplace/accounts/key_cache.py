"""API-key lookups cached in Redis, with revocation that takes effect on the next request.

Every API request looks its key up; with REDIS_URL set (and GPUFLEX_KEY_CACHE_S > 0) the
live key's ids are kept under its digest for KEY_CACHE_S, so a heartbeat's authentication is
one Redis MGET and no database. Only ids are cached: the key's user and node are loaded
from the database when a view touches them, so a price or a reliability is never stale.

Revocation, a deactivated user and a deleted key or node (signals, `connect`) delete the
entry and leave a "bypass" mark beside it for twice the cache's lifetime: a lookup that sees
the mark goes to the database and caches nothing. The mark closes the race in which a
request that read the key just before the revocation committed writes its stale entry back
after the delete: that entry is ignored while the mark lives, and it expires before the
mark does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis
from django.conf import settings
from django.db.models.signals import post_delete, post_save

from marketplace.accounts.models import ApiKey, User
from marketplace.server import shared_redis

log = logging.getLogger(__name__)

MISS = object()  # not cached: ask the database (and, when `may_store`, cache its answer)


def _redis() -> redis.Redis | None:
    return shared_redis.client() if settings.GPUFLEX["KEY_CACHE_S"] > 0 else None


def _entry(digest: str) -> str:
    return shared_redis.key("key", digest)


def _bypass(digest: str) -> str:
    return shared_redis.key("key-bypass", digest)


def redis_client() -> redis.Redis | None:
    """The cache's Redis (None: no cache, every lookup asks the database)."""
    return _redis()


def redis_keys(digest: str) -> tuple[str, str]:
    """A key's entry and its bypass mark, for a script that looks the key up inside Redis
    with `lookup`'s rule (api/heartbeat_fast.py): a mark means ask the database."""
    return _entry(digest), _bypass(digest)


def lookup(digest: str) -> tuple[ApiKey | None, bool]:
    """(the cached live key, built without the database, or None) and whether the caller may
    cache what the database says (False while a bypass mark stands, or without Redis)."""
    r = _redis()
    if r is None:
        return None, False
    try:
        raw, bypass = r.mget(_entry(digest), _bypass(digest))
    except redis.RedisError as exc:
        log.warning("key cache: Redis unreachable (%s); asking the database", exc)
        return None, False
    if bypass is not None:
        return None, False
    if raw is None:
        return None, True
    try:
        d = json.loads(raw)
        key = ApiKey(
            pk=int(d["id"]), user_id=int(d["user"]), node_id=d["node"], digest=digest,
            prefix=str(d["prefix"]), name=str(d["name"]),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError):
        return None, True
    key._state.adding, key._state.db = False, "default"
    return key, True


def store(key: ApiKey) -> None:
    """Cache a live key the database just returned."""
    r = _redis()
    if r is None:
        return
    value = json.dumps(
        {"id": key.pk, "user": key.user_id, "node": key.node_id, "prefix": key.prefix,
         "name": key.name},
    )  # fmt: skip
    try:
        r.set(_entry(key.digest), value, ex=int(settings.GPUFLEX["KEY_CACHE_S"]))
    except redis.RedisError as exc:
        log.warning("key cache: could not store a key (%s)", exc)


def forget(digests: Iterable[str]) -> None:
    """Drop these keys from the cache, with a bypass mark each (see the module's docstring).
    At once, not when the change commits: until then the database still shows the key live,
    but nobody caches it while the mark stands; a change rolled back only leaves the key
    looked up in the database for a while."""
    digests = list(digests)
    r = _redis()
    if not digests or r is None:
        return
    ttl = 2 * int(settings.GPUFLEX["KEY_CACHE_S"]) + 1
    with r.pipeline(transaction=False) as pipe:
        for digest in digests:
            pipe.set(_bypass(digest), 1, ex=ttl)
            pipe.delete(_entry(digest))
        pipe.execute()


def _key_changed(sender: type, instance: ApiKey, **kwargs: object) -> None:
    if kwargs.get("signal") is post_delete or instance.revoked_at is not None:
        forget([instance.digest])


def _user_changed(sender: type, instance: User, **kwargs: object) -> None:
    if not instance.is_active:
        forget(ApiKey.objects.filter(user=instance).values_list("digest", flat=True))


def connect() -> None:
    """Called from AccountsConfig.ready: revocation through any save or delete, including a
    node's deletion cascading to its key."""
    post_save.connect(_key_changed, sender=ApiKey, dispatch_uid="key_cache.key_saved")
    post_delete.connect(_key_changed, sender=ApiKey, dispatch_uid="key_cache.key_deleted")
    post_save.connect(_user_changed, sender=User, dispatch_uid="key_cache.user_saved")
