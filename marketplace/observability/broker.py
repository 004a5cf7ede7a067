"""The Celery broker as the web process sees it: reachable or not, and how many messages wait
in GPUFlex's queues. Read from settings each time (not the Celery app's cached connection), so
a check answers for the broker configured now, with short timeouts so that a dead broker makes
/readyz say so quickly rather than hang."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from marketplace.server.routing import worker_queues

TIMEOUT_S = 2.0


def _filesystem_folder() -> Path | None:
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    folder = options.get("data_folder_out")
    return Path(folder) if folder else None


def _is_filesystem(url: str) -> bool:
    return url.startswith("filesystem://")


def _is_redis(url: str) -> bool:
    return urlsplit(url).scheme in {"redis", "rediss"}


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)


def check() -> None:
    """Raise (with a message saying what) when the broker cannot take a message now."""
    url = settings.CELERY_BROKER_URL
    if _is_filesystem(url):
        folder = _filesystem_folder()
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK):
            raise OSError(f"broker folder {folder} is missing or not writable")
        return
    if _is_redis(url):
        _redis(url).ping()
        return
    from kombu import Connection

    with Connection(url, connect_timeout=TIMEOUT_S) as conn:
        conn.ensure_connection(max_retries=1, timeout=TIMEOUT_S)


def queue_lengths() -> dict[str, int]:
    """Messages waiting per GPUFlex queue (the default and the aggregation queue); {} for a
    broker whose queues this cannot count (AMQP: its own management API shows them)."""
    url = settings.CELERY_BROKER_URL
    names = worker_queues("all")
    if _is_filesystem(url):
        folder = _filesystem_folder()
        if folder is None or not folder.is_dir():
            return {}
        counts = dict.fromkeys(names, 0)
        # kombu's filesystem transport: one `<stamp>_<uuid>.<queue>.msg` file a message
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.endswith(".msg"):
                    continue
                queue = entry.name[: -len(".msg")].split(".", 1)[-1]
                if queue in counts:
                    counts[queue] += 1
        return counts
    if _is_redis(url):
        client = _redis(url)
        # kombu's Redis transport keeps a queue as a list named after it (priority 0)
        return {name: int(client.llen(name)) for name in names}
    return {}
