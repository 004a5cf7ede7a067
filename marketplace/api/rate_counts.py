"""Counters for the rate limits, shared by every process of the deployment and atomic.

DRF's own throttles keep a list of timestamps in the cache and write it back after reading
it: concurrent requests all read the same short list and all pass, and with the embedded
setup's per-process memory cache every web worker counted on its own. Here one count is
one atomic increment that returns the new value, so of N concurrent requests exactly the
first `limit` see a value within the limit, whichever worker serves them:

- with REDIS_URL, Redis: a throttle's whole check (count, read the previous window, take the
  count back when over) is one Lua script, one round trip, atomic in Redis;
- without it (the embedded setup, one machine), a small SQLite file in the data folder,
  whose upsert ... RETURNING is atomic across processes.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

import redis
from django.conf import settings

from marketplace.server import shared_redis

log = logging.getLogger(__name__)

# an expired count is deleted by about one increment in this many (old windows' rows)
_SWEEP_ONE_IN = 200


class Counts(Protocol):
    def add(self, key: str, delta: int, ttl_s: float, also: str | None = None) -> tuple[int, int]:
        """Add `delta` to `key`'s count (kept at least `ttl_s` seconds) and return it, with
        the count of `also` read in the same call (0 if it has none)."""
        ...

    def get(self, key: str, also: str) -> tuple[int, int]:
        """The counts of `key` and `also`, 0 for none."""
        ...

    def take(
        self, key: str, also: str, ttl_s: float, limit: int, into: float
    ) -> tuple[bool, int, int]:
        """Count one event under `key` if the sliding window allows it: (allowed, the count
        of `key` after, the count of `also`). Over the rate (`key`'s count plus `also`'s
        weighted by 1 - `into` above `limit`), the count is taken back."""
        ...

    def clear(self) -> None: ...


def over(count: int, previous: int, into: float, limit: int) -> bool:
    """The sliding window's rule (throttles.py), the same in the Lua script below."""
    return count + previous * (1 - into) > limit


# The sliding window's take as a Lua function, for this module's script and for any other
# script that counts a request as one of its steps (api/heartbeat_fast.py): arguments are
# the current window's count's key, the previous one's, ttl (s), limit, into. The
# arithmetic is over()'s, in doubles as in Python.
TAKE_FUNCTION = """
local function take(current, previous_key, ttl, limit, into)
  local count = redis.call('INCRBY', current, 1)
  redis.call('EXPIRE', current, ttl)
  local previous = tonumber(redis.call('GET', previous_key) or '0')
  if count + previous * (1 - tonumber(into)) > tonumber(limit) then
    count = redis.call('INCRBY', current, -1)
    return {0, count, previous}
  end
  return {1, count, previous}
end
"""

# KEYS: the current window's count, the previous one's; ARGV: ttl (s), limit, into
_TAKE = TAKE_FUNCTION + "return take(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])\n"


def redis_key(key: str) -> str:
    """Where a count is kept in Redis."""
    return shared_redis.key("rate", key)


def ttl_arg(ttl_s: float) -> int:
    """A count's expiry as the script takes it: whole seconds, at least `ttl_s`."""
    return max(1, int(ttl_s) + 1)


class RedisCounts:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _key(self, key: str) -> str:
        return redis_key(key)

    def add(self, key: str, delta: int, ttl_s: float, also: str | None = None) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        pipe.incrby(self._key(key), delta)
        pipe.expire(self._key(key), max(1, int(ttl_s) + 1))
        pipe.get(self._key(also or key))
        count, _, other = pipe.execute()
        return int(count), int(other or 0) if also else 0

    def get(self, key: str, also: str) -> tuple[int, int]:
        first, second = self.client.mget([self._key(key), self._key(also)])
        return int(first or 0), int(second or 0)

    def take(
        self, key: str, also: str, ttl_s: float, limit: int, into: float
    ) -> tuple[bool, int, int]:
        keys = [self._key(key), self._key(also)]
        # EVALSHA; redis-py loads the script and retries once when Redis does not know it
        allowed, count, previous = _script(self.client)(
            keys=keys, args=[ttl_arg(ttl_s), limit, repr(into)]
        )
        return bool(allowed), int(count), int(previous)

    def clear(self) -> None:
        for key in self.client.scan_iter(self._key("*")):
            self.client.delete(key)


class SQLiteCounts:
    """One table in a file of its own (not the main database: these writes never wait for
    a long transaction there), in WAL mode so readers do not block the writer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None or self._local.pid != os.getpid():  # a forked worker opens its own
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a count lost to a power cut is no loss
            db.execute(
                "CREATE TABLE IF NOT EXISTS counts "
                "(key TEXT PRIMARY KEY, n INTEGER NOT NULL, expires REAL NOT NULL)"
            )
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def add(self, key: str, delta: int, ttl_s: float, also: str | None = None) -> tuple[int, int]:
        db, now = self._db(), time.time()
        (count,) = db.execute(
            "INSERT INTO counts (key, n, expires) VALUES (?, ?, ?) ON CONFLICT (key) "
            "DO UPDATE SET n = n + excluded.n, expires = excluded.expires RETURNING n",
            (key, delta, now + ttl_s),
        ).fetchone()
        if random.randrange(_SWEEP_ONE_IN) == 0:
            db.execute("DELETE FROM counts WHERE expires < ?", (now,))
        return int(count), self._one(db, also, now) if also else 0

    def take(
        self, key: str, also: str, ttl_s: float, limit: int, into: float
    ) -> tuple[bool, int, int]:
        count, previous = self.add(key, 1, ttl_s, also=also)
        if not over(count, previous, into, limit):
            return True, count, previous
        count, _ = self.add(key, -1, ttl_s)
        return False, count, previous

    def get(self, key: str, also: str) -> tuple[int, int]:
        db, now = self._db(), time.time()
        return self._one(db, key, now), self._one(db, also, now)

    @staticmethod
    def _one(db: sqlite3.Connection, key: str, now: float) -> int:
        row = db.execute("SELECT n FROM counts WHERE key = ? AND expires >= ?", (key, now))
        found = row.fetchone()
        return int(found[0]) if found else 0

    def clear(self) -> None:
        self._db().execute("DELETE FROM counts")


def store() -> Counts:
    """Redis where the deployment has it, else the data folder's file."""
    client = shared_redis.client()
    if client is not None:
        return RedisCounts(client)
    return _sqlite(str(Path(settings.DATA_DIR) / "rate-counts.sqlite3"))


_scripts: dict[tuple[int, str], redis.commands.core.Script] = {}


def script(client: redis.Redis, source: str) -> redis.commands.core.Script:
    """A Lua script registered with `client` once (its SHA computed once, not per call);
    called, it is one EVALSHA (redis-py loads it and retries once where Redis lacks it)."""
    found = _scripts.get((id(client), source))
    if found is None:
        found = _scripts[(id(client), source)] = client.register_script(source)
    return found


def _script(client: redis.Redis) -> redis.commands.core.Script:
    return script(client, _TAKE)


@functools.lru_cache(maxsize=8)
def _sqlite(path: str) -> SQLiteCounts:
    return SQLiteCounts(Path(path))
