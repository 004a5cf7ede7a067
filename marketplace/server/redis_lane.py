"""One Redis connection per thread for the agent requests' Redis calls: the lean key script
(api/lean_key.py) and a claim's doorbell (events/doorbell.py).

redis-py's `Script.__call__` costs a heartbeat more CPU than the rest of its Redis work: it
checks a connection out of the pool (a `poll` of the socket to see it holds no stale reply),
packs each argument through the encoder, runs the command under the retry wrapper and puts
the connection back (cProfile of the lean heartbeat: 28 % of it). A heartbeat makes exactly
one call, on the web server's thread that serves it, so that thread keeps a connection of its
own, made with the client's settings (address, timeouts), and the command goes out packed by
hand: about 20 µs against 70 µs through the client, measured in one process
(docs/scale.md, eleventh pass).

A failure is the caller's, as a failed call through the client would be: the connection is
dropped (the next call makes a new one) and redis.ConnectionError raised. Nothing is sent
again, since a script that counts must not run twice; the lean paths then hand the request
to the DRF view, which does each step on its own (api/claim_fast.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import redis
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import NoScriptError


class _Lane(threading.local):
    conn: AbstractConnection | None = None
    pool: object = None
    pid: int = 0


_lane = _Lane()


def _connection(client: redis.Redis) -> AbstractConnection:
    pool = client.connection_pool
    conn = _lane.conn
    # a connection made before a fork, or for another client, is not this thread's to use
    if conn is None or _lane.pool is not pool or _lane.pid != os.getpid():
        if conn is not None and _lane.pid == os.getpid():
            conn.disconnect()  # another client's: its socket is closed now, not at collection
        conn = pool.make_connection()
        _lane.conn, _lane.pool, _lane.pid = conn, pool, os.getpid()
    return conn


def _drop() -> None:
    conn, _lane.conn = _lane.conn, None
    if conn is not None:
        conn.disconnect()


def _packed(parts: Sequence[bytes]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value).encode()
    raise TypeError(f"a script argument must be bytes, str, int or float, not {type(value)}")


def call(client: redis.Redis, *commands: Sequence[object]) -> list[object]:
    """Each command's reply, the commands sent in one write on this thread's connection to
    `client`'s server and their replies read in order; a reply that is an error comes back
    as its exception (redis.ResponseError), in its place, with the connection still good."""
    packed = b"".join(_packed([_bytes(a) for a in command]) for command in commands)
    conn = _connection(client)
    replies: list[object] = []
    try:
        conn.send_packed_command([packed], check_health=False)
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:  # read whole: the next reply is still owed
                replies.append(exc)
    except (redis.RedisError, OSError) as exc:
        _drop()
        raise redis.ConnectionError(f"Redis call failed: {exc}") from exc
    return replies


def run_script(
    client: redis.Redis, script: Script, keys: Sequence[object], args: Sequence[object]
) -> object:
    """`script(keys=keys, args=args)` on this thread's own connection to `client`'s server:
    one EVALSHA (a SCRIPT LOAD first where the server lacks the script). The script's own
    error is raised as redis.ResponseError."""
    command = [b"EVALSHA", script.sha, len(keys), *keys, *args]
    (reply,) = call(client, command)
    if isinstance(reply, NoScriptError):  # a restarted or flushed server: load it, once
        _, reply = call(client, [b"SCRIPT", b"LOAD", script.script], command)
    if isinstance(reply, redis.ResponseError):
        raise reply
    return reply
