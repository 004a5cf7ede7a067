"""The agent requests' own Redis connection per thread (marketplace/server/redis_lane.py):
the answers redis-py's Script gives, a script the server lacks loaded, a dead connection
reported and replaced, never a command sent twice."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
import redis

from marketplace.server import redis_lane

SOURCE = "redis.call('INCR', KEYS[1]); return {1, tonumber(ARGV[1]), ARGV[2]}"


@pytest.fixture
def r():
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    client = redis.Redis.from_url("redis://127.0.0.1:6379/11")
    yield client
    redis_lane._drop()  # this thread's connection, to a client the next test does not use


def _script(r: redis.Redis) -> redis.commands.core.Script:
    # a source no other test loads: the first call finds it missing on the server
    return r.register_script(f"-- {uuid.uuid4().hex}\n{SOURCE}")


def test_answers_as_the_client_does_and_loads_a_missing_script(r) -> None:
    key = f"test-lane-{uuid.uuid4().hex}"
    script = _script(r)
    assert not r.script_exists(script.sha)[0]
    got = redis_lane.run_script(r, script, keys=[key], args=[41, "x"])
    assert got == [1, 41, b"x"] == script(keys=[key], args=[41, "x"])
    assert r.get(key) == b"2"  # once each: the missing script did not run the command twice
    r.delete(key)


def test_a_dead_connection_is_reported_then_replaced(r) -> None:
    key = f"test-lane-{uuid.uuid4().hex}"
    script = _script(r)
    redis_lane.run_script(r, script, keys=[key], args=[1, "a"])
    conn = redis_lane._lane.conn
    conn.send_command("CLIENT", "ID")
    r.client_kill_filter(_id=conn.read_response())
    with pytest.raises(redis.ConnectionError):
        redis_lane.run_script(r, script, keys=[key], args=[2, "b"])
    assert redis_lane._lane.conn is None  # dropped, not sent again on a new one
    assert r.get(key) == b"1"
    assert redis_lane.run_script(r, script, keys=[key], args=[3, "c"]) == [1, 3, b"c"]
    assert r.get(key) == b"2"
    r.delete(key)


def test_each_thread_has_its_own_connection(r) -> None:
    script = _script(r)
    key = f"test-lane-{uuid.uuid4().hex}"
    conns = []

    def call() -> None:
        redis_lane.run_script(r, script, keys=[key], args=[1, "t"])
        conns.append(redis_lane._lane.conn)
        redis_lane._drop()

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conns) == 2 and conns[0] is not conns[1]
    assert r.get(key) == b"2"
    r.delete(key)


def test_a_script_error_keeps_the_connection(r) -> None:
    key = f"test-lane-{uuid.uuid4().hex}"
    failing = r.register_script(f"-- {uuid.uuid4().hex}\nreturn redis.error_reply('nope')")
    with pytest.raises(redis.ResponseError, match="nope"):
        redis_lane.run_script(r, failing, keys=[], args=[])
    conn = redis_lane._lane.conn
    assert conn is not None
    assert redis_lane.run_script(r, _script(r), keys=[key], args=[1, "z"]) == [1, 1, b"z"]
    assert redis_lane._lane.conn is conn
    r.delete(key)


def test_refuses_an_argument_it_cannot_send(r) -> None:
    with pytest.raises(TypeError, match="bool"):
        redis_lane.run_script(r, _script(r), keys=["k"], args=[True, "x"])
