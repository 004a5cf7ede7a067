"""Node presence and the API-key cache on the real Redis (127.0.0.1:6379), each test under a
key prefix of its own: heartbeats land in Redis, not the database, and the tick's flush
writes them; offline detection and leases see them; a revoked key fails on its next request
however it was cached; concurrent claims never lease a task twice; without Redis (or with
Redis down) the same service writes the database directly."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.accounts import key_cache, keys
from marketplace.accounts.models import ApiKey
from marketplace.accounts.services import revoke_key
from marketplace.nodes import presence
from marketplace.nodes.models import Node
from marketplace.nodes.services import mark_offline
from marketplace.rounds.models import Task
from marketplace.rounds.scheduling import claim_next
from marketplace.server import shared_redis
from tests.marketplace.helpers import SMALL_SPEC, client_for

# transactional: commits are real, as in the server (and threads claim concurrently)
pytestmark = pytest.mark.django_db(transaction=True)


def _row(agent) -> Node:
    return Node.objects.get(pk=agent.node_id)


def test_heartbeat_goes_to_redis_and_the_flush_writes_it(with_redis, make_agent) -> None:
    agent = make_agent()
    before = _row(agent)
    assert agent.heartbeat("working", metrics={"gpu_util": 0.9}).status_code == 200
    # the database has not been written: the beat waits in Redis
    row = _row(agent)
    assert (row.state, row.last_heartbeat_at) == ("idle", before.last_heartbeat_at)
    assert presence.pending() == 1
    assert presence.flush() == 1
    row = _row(agent)
    assert row.state == "working" and row.metrics["gpu_util"] == 0.9
    assert row.live_network == {"rtt_ms": 20}
    assert row.last_heartbeat_at > before.last_heartbeat_at
    assert presence.pending() == 0 and presence.flush() == 0


def test_a_heartbeat_with_a_cached_key_touches_no_database(
    with_redis, make_agent, django_assert_num_queries
) -> None:
    agent = make_agent()
    agent.heartbeat()  # looks the key up in the database and caches it
    with django_assert_num_queries(0):
        assert agent.heartbeat("paused", reason="owner busy").status_code == 200
    presence.flush()
    assert (_row(agent).state, _row(agent).state_reason) == ("paused", "owner busy")


def test_offline_detection_sees_heartbeats_still_in_redis(with_redis, make_agent) -> None:
    alive, silent = make_agent(), make_agent()
    long_ago = timezone.now() - timedelta(hours=1)
    Node.objects.filter(pk__in=[alive.node_id, silent.node_id]).update(last_heartbeat_at=long_ago)
    alive.heartbeat("working")  # in Redis only, until offline detection flushes it
    assert presence.pending() == 1
    assert mark_offline() == [silent.node_id]
    assert _row(alive).state == "working" and _row(silent).state == "offline"


def test_a_claim_marks_its_node_seen_and_brings_it_back_from_offline(
    with_redis, make_agent
) -> None:
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(state="offline")
    assert agent.claim() is None  # no work: 204, still a sign of life
    assert _row(agent).state == "offline"
    presence.flush()
    assert _row(agent).state == "idle"


def test_heartbeats_keep_leases_through_the_flush(with_redis, make_agent, submit) -> None:
    agent = make_agent()
    submit()
    task = claim_next(_row(agent))
    soon = timezone.now() + timedelta(seconds=5)  # less than half the lease left
    Task.objects.filter(pk=task.pk).update(lease_expires=soon)
    agent.heartbeat("working", task_id=str(task.pk), task_ids=["not-a-uuid"])
    assert Task.objects.get(pk=task.pk).lease_expires == soon  # not yet: Redis holds it
    presence.flush()
    assert Task.objects.get(pk=task.pk).lease_expires > soon + timedelta(seconds=60)


def test_a_revoked_key_fails_on_its_next_request_even_when_cached(with_redis, make_agent) -> None:
    agent = make_agent()
    assert agent.heartbeat().status_code == 200
    key = ApiKey.objects.get(node_id=agent.node_id)
    assert with_redis.exists(shared_redis.key("key", key.digest))  # cached
    revoke_key(key)
    assert agent.heartbeat().status_code == 401
    # a request that read the key before the revocation committed writes its stale entry
    # back afterwards: the bypass mark keeps it unused
    key.revoked_at = None
    key_cache.store(key)
    assert agent.heartbeat().status_code == 401


def test_a_rotated_or_deactivated_users_key_fails_at_once(with_redis, make_user) -> None:
    user, plaintext = make_user("provider")
    client = client_for(plaintext)
    assert client.get("/api/v1/nodes/").status_code == 200
    assert client.get("/api/v1/nodes/").status_code == 200  # from the cache
    assert key_cache.lookup(keys.digest(plaintext))[0] is not None
    user.is_active = False
    user.save()
    assert client.get("/api/v1/nodes/").status_code == 401


def test_concurrent_claims_through_the_api_never_lease_a_task_twice(
    with_redis, make_agent, submit
) -> None:
    agents = [make_agent() for _ in range(6)]
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 40}}, tier="volunteer")
    claimed: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(agents))

    def run(agent) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.key}")
        try:
            barrier.wait()
            while True:
                response = client.post("/api/v1/agent/claim?max=4")
                if response.status_code == 204:
                    return
                assert response.status_code == 200, response.content
                claimed.extend((agent.node_id, t["id"]) for t in response.json()["tasks"])
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counts = Counter(task for _, task in claimed)
    assert counts and max(counts.values()) == 1, "a task was leased twice"
    leased = {str(t.pk): t.node_id for t in Task.objects.filter(status="leased")}
    assert leased == {task: node for node, task in claimed}
    assert presence.flush() == len(agents)  # every claim marked its node seen


def test_without_redis_the_same_service_writes_the_database(settings, make_agent) -> None:
    settings.REDIS_URL = ""
    agent = make_agent()
    agent.heartbeat("working")
    assert _row(agent).state == "working"
    assert presence.pending() == 0 and presence.flush() == 0


def test_with_redis_down_heartbeats_and_keys_fall_back_to_the_database(
    settings, make_agent
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = make_agent()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    assert agent.heartbeat("working").status_code == 200
    assert _row(agent).state == "working"
