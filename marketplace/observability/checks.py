"""What /readyz checks: the dependencies a request may need (the database, the Celery
broker that takes aggregations and ticks, the cache behind throttles and presence)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.core.cache import cache
from django.db import connection

from marketplace.observability import broker


def database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def cache_roundtrip() -> None:
    key = f"gpuflex:readyz:{uuid.uuid4().hex}"
    cache.set(key, "1", timeout=5)
    if cache.get(key) != "1":
        raise RuntimeError("a value written to the cache did not read back")
    cache.delete(key)


CHECKS: dict[str, Callable[[], None]] = {
    "database": database,
    "broker": broker.check,
    "cache": cache_roundtrip,
}


def run() -> dict[str, str]:
    """Each dependency's state: "ok", or what went wrong (the exception's type and message)."""
    out: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            check()
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            out[name] = "ok"
    return out
