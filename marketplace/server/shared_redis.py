"""The deployment's Redis for the hot paths (node presence, the API-key cache), or None.

Only where REDIS_URL is set: the embedded setup (`make demo`) has no Redis, and its
per-process memory cache would not do, since a revocation in one web worker must reach
every other. Callers take None as "use the database directly".
"""

from __future__ import annotations

import functools

import redis
from django.conf import settings

# a hot-path call that cannot reach Redis soon falls back to the database
_TIMEOUT_S = 2.0


def client() -> redis.Redis | None:
    url = getattr(settings, "REDIS_URL", "")
    return _client_for(url) if url else None


@functools.lru_cache(maxsize=8)
def _client_for(url: str) -> redis.Redis:
    # redis-py's pool notices a fork (the web server's workers) and opens its own connections there
    return redis.Redis.from_url(url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S)


def key(*parts: object) -> str:
    """A Redis key under the deployment's prefix (GPUFLEX_REDIS_PREFIX): several deployments,
    or tests, can share one Redis database."""
    return ":".join([settings.GPUFLEX["REDIS_PREFIX"], *map(str, parts)])
