"""Doorbells: a topic is rung after the change it names commits; open streams hear it.

A ring carries no data. The stream that hears it renders its page's state again, from the
database, and sends it if it changed: nothing is pushed that a reload would not show, and a
ring that is lost costs only latency (streams also re-render at each keepalive).

With REDIS_URL the bell is Redis pub/sub, one channel per topic, so a change committed by a
Celery worker reaches the web processes at once. The embedded setup (`make demo`) has no
Redis, and its processes share only the data folder: there the bell is one file that each
ring appends a byte to, and every stream checks it (a stat) every POLL_S. Its size, not its
modification time, tells a ring: the kernel stamps times at a few milliseconds' grain, so two
rings that close would look like one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from pathlib import Path

import redis
from django.conf import settings

from marketplace.server import redis_lane, shared_redis

log = logging.getLogger(__name__)

POLL_S = 0.02  # the embedded bell's stat interval: well under the 100 ms a page may lag
BELL_MAX_BYTES = 1 << 20  # then it starts again from empty (its size changes all the same)


def ring(topics: Iterable[str]) -> None:
    """Tell the streams listening on any of `topics` that it changed. Never raises: a page
    that misses a ring catches up at its next keepalive."""
    topics = sorted(set(topics))
    if not topics:
        return
    client = shared_redis.client()
    if client is None:
        with contextlib.suppress(OSError):
            path = _bell_file()
            with path.open("ab") as bell:  # O_APPEND: rings from several processes all land
                bell.write(b"\n")
                if bell.tell() > BELL_MAX_BYTES:
                    bell.truncate(0)
        return
    try:
        # on the serving thread's own connection, in one write (a claim rings once)
        redis_lane.call(client, *([b"PUBLISH", _channel(topic), b"1"] for topic in topics))
    except redis.RedisError as exc:
        log.warning("live push: could not ring %s: %s", ",".join(topics), exc)


class Listener:
    """Subscribed to some topics from creation on, so a change made while its first state
    renders is heard, not lost."""

    def __init__(self, topics: Iterable[str]) -> None:
        self._pubsub = None
        url = getattr(settings, "REDIS_URL", "")
        if url:
            self._pubsub = _subscriber(url).pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(*[_channel(t) for t in topics])
        else:
            self._seen = _bell_state()

    def wait(self, timeout: float) -> bool:
        """True when rung within `timeout` seconds (rings that came together count once)."""
        deadline = time.monotonic() + timeout
        if self._pubsub is not None:
            try:
                return self._heard(deadline)
            except redis.RedisError as exc:
                log.warning("live push: lost the Redis subscription: %s", exc)
                time.sleep(max(0.0, deadline - time.monotonic()))
                return True  # render again: whatever changed meanwhile is sent
        while True:
            now = _bell_state()
            if now != self._seen:
                self._seen = now
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))

    def _heard(self, deadline: float) -> bool:
        assert self._pubsub is not None
        while True:
            # None also for the subscription's own confirmation, which is skipped: keep
            # waiting until the deadline
            message = self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None:
                while self._pubsub.get_message(timeout=0) is not None:
                    pass  # rings that came together count once
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError):
                self._pubsub.close()


def _channel(topic: str) -> str:
    return shared_redis.key("events", topic)


@functools.lru_cache(maxsize=8)
def _subscriber(url: str) -> redis.Redis:
    # no socket timeout: a subscription is idle between rings by design (get_message waits
    # with select); the hot-path client's 2 s timeout would drop it
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, health_check_interval=30)


def _bell_file() -> Path:
    return Path(settings.DATA_DIR) / "events-bell"


def _bell_state() -> tuple[int, int]:
    """The bell's state: any ring changes it (its size, and its time if it was emptied)."""
    try:
        st = _bell_file().stat()
    except OSError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)
