"""The lean heartbeat (api/heartbeat_fast.py) against the DRF view it stands in for: the same
validated body for every body it accepts, the same bytes answered, one Redis round trip and
no database, a revoked key refused at once, the throttle's 429 with the counts shared by both
paths, the heartbeat counted in /metrics, and everything else still the DRF view's."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY
from rest_framework.renderers import JSONRenderer

from marketplace.accounts import key_cache
from marketplace.accounts.models import ApiKey
from marketplace.accounts.services import revoke_key
from marketplace.api import heartbeat_fast, lean_key
from marketplace.api.heartbeat_body import plain_body
from marketplace.api.serializers.agent import HeartbeatReplySerializer, HeartbeatSerializer
from marketplace.api.throttles import HeartbeatThrottle
from marketplace.nodes import presence
from tests.marketplace.helpers import LeanPaths, counted, redis_commands

URL = "/api/v1/agent/heartbeat"

BEAT = {
    "state": "working", "task_id": "t-1", "task_ids": ["t-1", "t-2"], "progress": 0.25,
    "metrics": {"gpu_util": 55, "gpu_temp_c": 61.5, "gpu_mem_used_mb": 2048},
    "network": {"rtt_ms": 20, "up_mbps": None, "down_mbps": 300.5, "loss": 0},
}  # fmt: skip

# bodies of every kind: those the lean path takes, and those it must leave to the serializer
BODIES = [
    BEAT,
    {"state": "idle"},
    {"state": "paused", "reason": "owner busy"},
    {"state": "waiting", "reason": ""},
    {"state": "idle", "task_id": None, "progress": None, "unknown": [1, 2]},
    {"state": "idle", "metrics": {"gpu_util": 0, "other": "x"}, "network": {}},
    {"state": "idle", "task_ids": []},
    {"state": "sleeping"},
    {"state": 1},
    {},
    [],
    "idle",
    None,
    {"state": "paused", "reason": " padded "},
    {"state": "paused", "reason": None},
    {"state": "paused", "reason": "x" * 201},
    {"state": "paused", "reason": "café"},
    {"state": "idle", "task_id": ""},
    {"state": "idle", "task_id": 5},
    {"state": "idle", "task_id": "x" * 65},
    {"state": "idle", "task_ids": "t-1"},
    {"state": "idle", "task_ids": [None]},
    {"state": "idle", "task_ids": ["t"] * 33},
    {"state": "idle", "progress": 1.5},
    {"state": "idle", "progress": "0.5"},
    {"state": "idle", "progress": True},
    {"state": "idle", "metrics": {"gpu_util": -1}},
    {"state": "idle", "metrics": {"gpu_util": None}},
    {"state": "idle", "metrics": {"gpu_util": "5"}},
    {"state": "idle", "metrics": {"gpu_util": 10**400}},
    {"state": "idle", "metrics": []},
    {"state": "idle", "metrics": None},
    {"state": "idle", "network": {"rtt_ms": -5}},
    {"state": "idle", "runtime": {"plan": "cpu", "torch": "2.4.0"}},
]


def _serializer(data: object) -> dict | None:
    body = HeartbeatSerializer(data=data)
    return dict(body.validated_data) if body.is_valid() else None


ODD = [None, 0, 1, -1, 0.5, 1e9, True, "", " a", "idle", "t-1", [], {}, ["t"], {"x": 1}]
GOOD = {
    "state": ["idle", "working", "paused", "waiting"],
    "reason": ["", "owner busy", "x" * 200],
    "task_id": [None, "t-1", "x" * 64],
    "task_ids": [[], ["t-1"], ["a", "b", "c"]],
    "progress": [None, 0, 1, 0.5],
}
FIGURES = {
    "gpu_util": [0, 50.5, 100], "gpu_temp_c": [-5, 70], "gpu_mem_used_mb": [0, 8192],
    "rtt_ms": [None, 1, 250.5], "up_mbps": [None, 10], "loss": [None, 0, 0.05], "zz": ODD,
}  # fmt: skip


def _random_body(rng: random.Random) -> dict:
    """Mostly well-formed bodies, each field odd now and then."""
    body: dict = {}
    for name in ("state", "reason", "task_id", "task_ids", "progress", "metrics", "network"):
        roll = rng.random()
        if roll < 0.25 and name != "state":
            continue
        if roll < 0.95:
            if name in ("metrics", "network"):
                names = rng.sample(sorted(FIGURES), 3)
                body[name] = {
                    f: rng.choice(FIGURES[f] if rng.random() < 0.9 else ODD) for f in names
                }
            else:
                body[name] = rng.choice(GOOD[name])
        else:
            body[name] = rng.choice(ODD)
    return body


def test_the_plain_check_accepts_only_what_the_serializer_accepts_and_agrees() -> None:
    rng = random.Random(36)
    bodies = [*BODIES, *(_random_body(rng) for _ in range(3000))]
    taken = 0
    for data in bodies:
        plain = plain_body(data)
        if plain is not None:
            taken += 1
            assert plain == _serializer(data), data
            # the beat stored from either is the same bytes (dict order included)
            assert json.dumps(plain) == json.dumps(_serializer(data)), data
    assert plain_body(BEAT) is not None and taken > 100  # the common shapes take the lean path


def test_the_reply_is_written_as_drf_writes_it() -> None:
    reply = {
        "server_time": datetime(2026, 11, 28, 22, 0, 1, 123456, tzinfo=UTC),
        "heartbeat_interval_s": 10,
        "lease_timeout_s": 300.0,
    }
    drf = JSONRenderer().render(HeartbeatReplySerializer(reply).data)
    assert heartbeat_fast.reply_bytes(reply) == drf


# -- through the server ----------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def paths(monkeypatch) -> LeanPaths:
    """Counts the lean path's answers; `paths.drf_only()` turns it off (the DRF view alone)."""
    return LeanPaths(heartbeat_fast, monkeypatch)


_TIME = re.compile(rb'"server_time":"[^"]+"')


def _post(agent, body: object, **extra):
    return agent.client.post(URL, json.dumps(body), content_type="application/json", **extra)


def _same(a, b) -> None:
    """Two answers alike byte for byte but for the server's time and the request id."""
    assert a.status_code == b.status_code
    assert _TIME.sub(b"T", a.content) == _TIME.sub(b"T", b.content), (a.content, b.content)
    skip = {"x-request-id", "retry-after"}
    assert {k: v for k, v in a.headers.items() if k.lower() not in skip} == {
        k: v for k, v in b.headers.items() if k.lower() not in skip
    }


@pytestmark_db
def test_a_plain_heartbeat_takes_one_round_trip_and_answers_as_drf(
    with_redis, make_agent, paths, django_assert_num_queries, monkeypatch
) -> None:
    agent = make_agent()
    assert _post(agent, BEAT).status_code == 200  # its first: the key is cached by DRF's path
    assert paths.lean == 0
    beats = presence.beats_key()
    drf_beat = json.loads(with_redis.hget(beats, str(agent.node_id)))
    with_redis.delete(beats)
    # the script as the server holds it once any lean request ran: the first one loads it
    with_redis.script_load(lean_key._SCRIPT)
    commands = redis_commands(monkeypatch)
    route = {"route": "/" + URL.lstrip("/"), "method": "POST", "status": "200"}
    before = REGISTRY.get_sample_value("gpuflex_heartbeats_total", {"state": "working"}) or 0
    requests = REGISTRY.get_sample_value("gpuflex_http_requests_total", route) or 0
    with django_assert_num_queries(0):
        lean = _post(agent, BEAT)
    assert lean.status_code == 200 and paths.lean == 1, lean.content
    assert commands == ["EVALSHA"]
    # counted in /metrics as the DRF view's heartbeats were
    assert REGISTRY.get_sample_value("gpuflex_heartbeats_total", {"state": "working"}) == before + 1
    assert REGISTRY.get_sample_value("gpuflex_http_requests_total", route) == requests + 1
    lean_beat = json.loads(with_redis.hget(beats, str(agent.node_id)))
    assert {**lean_beat, "t": 0} == {**drf_beat, "t": 0}
    assert lean["X-Request-ID"]
    paths.drf_only()
    _same(lean, _post(agent, BEAT))
    presence.flush()
    agent_row = agent_node(agent)
    assert agent_row.state == "working" and agent_row.metrics["progress"] == 0.25


def agent_node(agent):
    from marketplace.nodes.models import Node

    return Node.objects.get(pk=agent.node_id)


@pytestmark_db
def test_every_other_body_is_answered_by_the_drf_view_alike(with_redis, make_agent, paths):
    agent = make_agent()
    assert _post(agent, BEAT).status_code == 200
    answers = [_post(agent, body) for body in BODIES]
    raw = [
        agent.client.post(URL, b"{", content_type="application/json"),
        agent.client.post(URL, b'{"state": NaN}', content_type="application/json"),
        agent.client.post(URL, b"[" * 100 + b"]" * 100, content_type="application/json"),
        agent.client.post(URL, b"state=idle", content_type="application/x-www-form-urlencoded"),
        agent.client.get(URL),
    ]  # fmt: skip
    lean = paths.lean
    assert lean == sum(plain_body(b) is not None for b in BODIES)
    html = _post(agent, BEAT, HTTP_ACCEPT="text/html")  # DRF's browsable API, as before
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    assert paths.lean == lean
    assert any(a.status_code == 400 for a in answers)
    paths.drf_only()
    for body, answer in zip(BODIES, answers, strict=True):
        _same(answer, _post(agent, body))
    again = [
        agent.client.post(URL, b"{", content_type="application/json"),
        agent.client.post(URL, b'{"state": NaN}', content_type="application/json"),
        agent.client.post(URL, b"[" * 100 + b"]" * 100, content_type="application/json"),
        agent.client.post(URL, b"state=idle", content_type="application/x-www-form-urlencoded"),
        agent.client.get(URL),
    ]  # fmt: skip
    for a, b in zip(raw, again, strict=True):
        _same(a, b)


@pytestmark_db
def test_a_revoked_key_fails_on_its_next_heartbeat(with_redis, make_agent, paths) -> None:
    agent = make_agent()
    assert _post(agent, BEAT).status_code == 200
    assert _post(agent, BEAT).status_code == 200 and paths.lean == 1  # cached: lean
    key = ApiKey.objects.get(node_id=agent.node_id)
    revoke_key(key)
    refused = _post(agent, BEAT)
    assert refused.status_code == 401 and refused.json()["error"] == "authentication_failed"
    # a request that read the key before the revocation committed writes its stale entry
    # back afterwards: the bypass mark keeps it unused by the script too
    key.revoked_at = None
    key_cache.store(key)
    assert _post(agent, BEAT).status_code == 401
    assert paths.lean == 1


@pytestmark_db
def test_a_user_key_is_refused_as_before(with_redis, make_user, paths) -> None:
    from tests.marketplace.helpers import client_for

    _, plaintext = make_user("provider")
    client = client_for(plaintext)
    assert client.get("/api/v1/nodes/").status_code == 200  # cached
    refused = client.post(URL, BEAT, format="json")
    assert refused.status_code == 403 and paths.lean == 0


@pytestmark_db
def test_the_throttle_counts_both_paths_and_answers_429(
    with_redis, make_agent, paths, monkeypatch
) -> None:
    small = HeartbeatThrottle.THROTTLE_RATES | {"heartbeat": "4/hour"}
    monkeypatch.setattr(HeartbeatThrottle, "THROTTLE_RATES", small)
    agent = make_agent()
    statuses = [_post(agent, BEAT).status_code for _ in range(4)]  # the first through DRF
    assert statuses == [200] * 4 and paths.lean == 3
    refused = _post(agent, BEAT)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"] == "throttled"
    assert _post(agent, {"state": "nonsense"}).status_code == 429  # the throttle comes first
    # the refused took their counts back
    assert counted(with_redis, HeartbeatThrottle(), ApiKey.objects.get(node_id=agent.node_id)) == 4


@pytestmark_db
def test_without_redis_the_drf_view_answers(settings, make_agent, paths) -> None:
    settings.REDIS_URL = ""
    agent = make_agent()
    assert _post(agent, BEAT).status_code == 200
    assert _post(agent, BEAT).status_code == 200
    assert paths.lean == 0
    assert agent_node(agent).state == "working"


def _fresh(agent):
    """The agent's key on a new test client: its middleware chain is built from the settings
    as they are now."""
    from tests.marketplace.helpers import client_for

    agent.client = client_for(agent.key)
    return agent


@pytestmark_db
def test_the_site_rules_still_apply_to_a_lean_heartbeat(
    with_redis, make_agent, paths, settings
) -> None:
    agent = make_agent()
    assert _post(agent, BEAT).status_code == 200  # cached
    # a host the site does not serve: the chain's 400, as before
    lean_count = paths.lean
    bad_host = _post(agent, BEAT, HTTP_HOST="evil.example")
    assert bad_host.status_code == 400 and paths.lean == lean_count
    # plain HTTP where the site redirects to HTTPS: the redirect, nothing recorded
    settings.SECURE_SSL_REDIRECT = True
    with_redis.delete(presence.beats_key())
    redirected = _post(_fresh(agent), BEAT)
    assert redirected.status_code == 301 and redirected["Location"].startswith("https://")
    assert paths.lean == lean_count and not with_redis.hlen(presence.beats_key())
    # over HTTPS: lean, with the security headers the chain would add (HSTS included)
    settings.SECURE_HSTS_SECONDS = 3600
    secure = _post(_fresh(agent), BEAT, secure=True)
    assert secure.status_code == 200 and paths.lean == lean_count + 1
    assert secure["Strict-Transport-Security"] == "max-age=3600"
    assert secure["X-Frame-Options"] and secure["X-Content-Type-Options"] == "nosniff"
    paths.drf_only()
    _same(secure, _post(_fresh(agent), BEAT, secure=True))


@pytestmark_db
def test_a_middleware_it_does_not_know_turns_the_lean_path_off(
    with_redis, make_agent, paths, settings
) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    agent = _fresh(make_agent())
    assert _post(agent, BEAT).status_code == 200
    assert _post(agent, BEAT).status_code == 200
    assert paths.lean == 0
