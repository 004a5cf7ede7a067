"""Node presence: heartbeats and "seen" marks, held in Redis and written to the database in
batches, or written straight through where there is no Redis.

Heartbeats are the hottest path on the server (every node, every few seconds). With
REDIS_URL set (and GPUFLEX_PRESENCE_IN_REDIS not 0) a heartbeat is one HSET: the node's
latest beat replaces its previous one in a hash, and `flush` (the periodic tick, before
offline detection reads `last_heartbeat_at`) takes the whole hash atomically and writes it
with one executemany in one transaction. Without Redis (the embedded SQLite setup) `record`
calls the very same `apply` with a batch of one, so there is one write of presence, not two.

The database lags Redis by at most one tick (TICK_S, 5 s by default) against a node timeout
of NODE_TIMEOUT_S (45 s): pages and the nodes API may show a heartbeat a tick late, offline
detection never misses one (`services.mark_offline` flushes first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction

from marketplace.nodes.models import Node, NodeState
from marketplace.server import shared_redis

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the node's state and figures, and the tasks it holds (their leases are
    kept alive by it)."""

    node_id: int
    at: datetime
    state: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Seen:
    """Any other authenticated agent call (a claim): the node is alive, and back from
    offline if it was; its state and figures are its heartbeats' to say."""

    node_id: int
    at: datetime


def _redis() -> redis.Redis | None:
    return shared_redis.client() if settings.GPUFLEX["PRESENCE_IN_REDIS"] else None


def _keys() -> tuple[str, str]:
    return shared_redis.key("presence", "beats"), shared_redis.key("presence", "seen")


def redis_client() -> redis.Redis | None:
    """Where heartbeats are held (None: written straight to the database)."""
    return _redis()


def beats_key() -> str:
    """The hash of heartbeats: a node's id → its latest beat, as `encode` writes it (the lean
    heartbeat's script, api/heartbeat_fast.py, writes there too)."""
    return _keys()[0]


def seen_key() -> str:
    """The hash of "seen" marks: a node's id → when it was last heard, as `encode_seen`
    writes it (the lean claim's script, api/lean_key.py, writes there too)."""
    return _keys()[1]


def record(mark: Beat | Seen) -> None:
    """Note a heartbeat or a sign of life: in Redis if configured, else (or if Redis cannot
    be reached) straight to the database."""
    r = _redis()
    if r is not None:
        beats, seen = _keys()
        try:
            if isinstance(mark, Beat):
                r.hset(beats, str(mark.node_id), encode(mark))
            else:
                r.hset(seen, str(mark.node_id), encode_seen(mark.at))
            return
        except redis.RedisError as exc:
            log.warning("presence: Redis unreachable (%s); writing to the database", exc)
    if isinstance(mark, Beat):
        apply([mark], [])
    else:
        apply([], [mark])


def flush() -> int:
    """Write what Redis holds to the database; returns how many marks were written. The hash
    is taken and emptied in one MULTI, so a heartbeat that arrives meanwhile waits for the
    next flush; if the write fails, what was taken goes back (HSETNX: never over a newer
    one) and the next flush tries again."""
    r = _redis()
    if r is None:
        return 0
    beats_key, seen_key = _keys()
    with r.pipeline(transaction=True) as pipe:
        pipe.hgetall(beats_key)
        pipe.delete(beats_key)
        pipe.hgetall(seen_key)
        pipe.delete(seen_key)
        raw_beats, _, raw_seen, _ = pipe.execute()
    beats = [b for k, v in raw_beats.items() if (b := _decode_beat(k, v)) is not None]
    seen = [s for k, v in raw_seen.items() if (s := _decode_seen(k, v)) is not None]
    try:
        apply(beats, seen)
    except Exception:
        with r.pipeline(transaction=False) as pipe:
            for k, v in raw_beats.items():
                pipe.hsetnx(beats_key, k, v)
            for k, v in raw_seen.items():
                pipe.hsetnx(seen_key, k, v)
            pipe.execute()
        raise
    return len(beats) + len(seen)


def pending() -> int:
    """How many nodes' marks wait in Redis for the next flush (0 without Redis)."""
    r = _redis()
    if r is None:
        return 0
    beats_key, seen_key = _keys()
    return int(r.hlen(beats_key)) + int(r.hlen(seen_key))


def apply(beats: Sequence[Beat], seen: Sequence[Seen]) -> None:
    """The one write of presence to the database, for a batch of any size: one executemany
    per kind (psycopg pipelines it). A mark never overwrites a newer one (two flushes that
    overlap may land in either order). Heartbeats also keep the leases of the tasks they
    name (`scheduling.extend_leases`)."""
    if not beats and not seen:
        return
    table = Node._meta.db_table
    prep = _prep
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # a heartbeat lost in a crash is replaced by the next one seconds later; not
            # waiting for the WAL flush on every batch is most of its cost
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        with connection.cursor() as cursor:
            if beats:
                cursor.executemany(
                    f"UPDATE {table} SET state = %s, state_reason = %s, metrics = %s, "
                    "live_network = %s, last_heartbeat_at = %s "
                    "WHERE id = %s AND (last_heartbeat_at IS NULL OR last_heartbeat_at <= %s)",
                    [
                        (b.state, b.reason, prep("metrics", b.metrics),
                         prep("live_network", b.network), prep("last_heartbeat_at", b.at),
                         b.node_id, prep("last_heartbeat_at", b.at))
                        for b in beats
                    ],
                )  # fmt: skip
            if seen:
                cursor.executemany(
                    f"UPDATE {table} SET last_heartbeat_at = %s, "
                    "state = CASE WHEN state = %s THEN %s ELSE state END "
                    "WHERE id = %s AND (last_heartbeat_at IS NULL OR last_heartbeat_at < %s)",
                    [
                        (prep("last_heartbeat_at", s.at), NodeState.OFFLINE, NodeState.IDLE,
                         s.node_id, prep("last_heartbeat_at", s.at))
                        for s in seen
                    ],
                )  # fmt: skip
    held = [(b.node_id, b.at, b.tasks) for b in beats if b.tasks]
    if held:
        # committed on its own, synchronously: a lease is money and work, not a figure
        from marketplace.rounds.scheduling import extend_leases

        extend_leases(held)


def _prep(name: str, value: object) -> object:
    return Node._meta.get_field(name).get_db_prep_save(value, connection)


def encode(beat: Beat) -> str:
    """A beat as the hash holds it (its node id is the hash's field, not in here)."""
    return json.dumps(
        {"t": beat.at.timestamp(), "s": beat.state, "r": beat.reason, "m": beat.metrics,
         "n": beat.network, "k": list(beat.tasks)},
        separators=(",", ":"),
    )  # fmt: skip


def encode_seen(at: datetime) -> str:
    """A "seen" mark as the hash holds it: when the node was heard, a POSIX timestamp."""
    return repr(at.timestamp())


def _decode_beat(node_id: bytes, raw: bytes) -> Beat | None:
    try:
        d = json.loads(raw)
        return Beat(
            node_id=int(node_id),
            at=datetime.fromtimestamp(float(d["t"]), UTC),
            state=str(d["s"]),
            reason=str(d.get("r", "")),
            metrics=dict(d.get("m") or {}),
            network=dict(d.get("n") or {}),
            tasks=tuple(str(t) for t in d.get("k") or ()),
        )
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("presence: dropping an unreadable beat of node %r: %s", node_id, exc)
        return None


def _decode_seen(node_id: bytes, raw: bytes) -> Seen | None:
    try:
        return Seen(int(node_id), datetime.fromtimestamp(float(raw), UTC))
    except (ValueError, TypeError) as exc:
        log.warning("presence: dropping an unreadable mark of node %r: %s", node_id, exc)
        return None
