"""The lean claim (api/claim_fast.py) against the DRF view it stands in for: the same query
values for every query it takes, the same bytes answered (200 and 204), one Redis round trip
before the claim's statements, a revoked key refused at once, the throttle's 429 with the
counts shared by both paths, the claim counted in /metrics, and everything else (a bad query
or key, a user key, no Redis) still the DRF view's."""

from __future__ import annotations

import itertools

import pytest
from django.http import QueryDict
from prometheus_client import REGISTRY

from marketplace.accounts import key_cache
from marketplace.accounts.models import ApiKey
from marketplace.accounts.services import revoke_key
from marketplace.api import claim_fast
from marketplace.api.serializers.agent import ClaimQuerySerializer
from marketplace.api.throttles import KeyRateThrottle
from marketplace.nodes import presence
from marketplace.rounds.models import Task
from tests.marketplace.helpers import SMALL_SPEC, LeanPaths, counted, redis_commands

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 12}}
URL = "/api/v1/agent/claim"
VALUES = ["1", "3", "8", "9", "0", "08", "12", "-1", "+2", " 2", "2 ", "1.0", "1e1", "", "x",
          "٣", "0.5", "30", "30.0", "30.001", "31", "2.125", "2.1255", "nan", "inf",
          "1_0"]  # fmt: skip


def _serializer(query: QueryDict) -> tuple[float, int] | None:
    body = ClaimQuerySerializer(data=query)
    return (body.validated_data["wait"], body.validated_data["max"]) if body.is_valid() else None


def test_the_plain_query_check_takes_only_what_the_serializer_takes_and_agrees() -> None:
    queries = ["", "max=8&wait=20", "max=2&max=3", "wait=1&other=2", "max", "wait="]
    queries += [f"{name}={v}" for name in ("max", "wait") for v in VALUES]
    queries += [f"max={a}&wait={b}" for a, b in itertools.product(VALUES[:8], VALUES[14:22])]
    taken = 0
    for text in queries:
        query = QueryDict(text)
        plain = claim_fast.plain_query(query)
        if plain is not None:
            taken += 1
            assert plain == _serializer(query), text
            assert type(plain[0]) is float and type(plain[1]) is int
    assert claim_fast.plain_query(QueryDict("max=8&wait=20")) == (20.0, 8)
    assert claim_fast.plain_query(QueryDict("")) == (0.0, 1)
    assert taken > 20


@pytest.fixture
def paths(monkeypatch) -> LeanPaths:
    """Counts the lean path's answers; `paths.drf_only()` turns it off (the DRF view alone)."""
    return LeanPaths(claim_fast, monkeypatch)


def _claim(agent, query: str = "max=3", key: str | None = None, **extra):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return agent.client.post(f"{URL}?{query}", **headers, **extra)


def _same(a, b) -> None:
    """Two answers alike byte for byte but for the request id."""
    assert (a.status_code, a.content) == (b.status_code, b.content)
    skip = {"x-request-id", "retry-after"}
    assert {k: v for k, v in a.headers.items() if k.lower() not in skip} == {
        k: v for k, v in b.headers.items() if k.lower() not in skip
    }


def _count(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0


def test_a_plain_claim_takes_one_round_trip_before_claiming_and_answers_as_drf(
    with_redis, make_agent, submit, paths, monkeypatch
) -> None:
    agent = make_agent()
    submit(SPEC)
    assert _claim(agent, "max=1").status_code == 200  # its first: the key is cached by DRF's
    assert paths.lean == 0
    with_redis.delete(presence.seen_key())
    commands = redis_commands(monkeypatch)
    route = {"route": URL, "method": "POST", "status": "200"}
    requests = _count("gpuflex_http_requests_total", route)
    leased = _count("gpuflex_claims_total", {"outcome": "leased"})
    lean = _claim(agent, "max=3", key="lean-claim-0001")
    assert lean.status_code == 200 and paths.lean == 1, lean.content
    # the key, the throttle and the seen mark: one EVALSHA, no MGET or HSET of their own
    assert commands[0] == "EVALSHA" and "MGET" not in commands and "HSET" not in commands
    assert with_redis.hexists(presence.seen_key(), str(agent.node_id))
    ids = [t["id"] for t in lean.json()["tasks"]]
    assert len(ids) == 3 and {str(t.pk) for t in _held(agent)} >= set(ids)
    assert _count("gpuflex_http_requests_total", route) == requests + 1
    assert _count("gpuflex_claims_total", {"outcome": "leased"}) == leased + 1
    # the same claim re-sent through the DRF view: its answer, byte for byte
    paths.drf_only()
    _same(lean, _claim(agent, "max=3", key="lean-claim-0001"))


def _held(agent) -> list[Task]:
    return list(Task.objects.filter(node_id=agent.node_id, status="leased"))


def test_no_work_is_the_same_204(with_redis, make_agent, paths) -> None:
    agent = make_agent()
    assert _claim(agent).status_code == 204  # cached
    lean = _claim(agent, "max=8&wait=0")
    assert lean.status_code == 204 and paths.lean == 1 and lean.content == b""
    paths.drf_only()
    _same(lean, _claim(agent, "max=8&wait=0"))


def test_every_other_query_or_key_is_answered_by_the_drf_view(
    with_redis, make_agent, submit, paths
) -> None:
    agent = make_agent()
    submit(SPEC)
    assert _claim(agent, "max=1").status_code == 200
    odd = [("max=9", None), ("max=0", None), ("wait=31", None), ("max=1", "short"),
           ("max=1", "bad key!"), ("max=1", "")]  # fmt: skip
    answers = [_claim(agent, q, k) for q, k in odd]
    assert paths.lean == 0 and {a.status_code for a in answers} == {400}
    assert "Idempotency-Key" in answers[3].json()["detail"]
    assert "max" in answers[0].json()["detail"]
    assert len(_held(agent)) == 1  # the refused leased nothing
    # asked for something but JSON: the view's content negotiation answers (DRF's pages)
    html = _claim(agent, "max=1", HTTP_ACCEPT="text/html")
    assert html.status_code == 200 and html["Content-Type"].startswith("text/html")
    # what the serializer takes but the plain check leaves: the view's claims
    assert _claim(agent, "max=1&max=2").status_code == 200
    assert _claim(agent, "max=1&other=1").status_code == 200
    assert paths.lean == 0 and len(_held(agent)) == 1 + 1 + 2 + 1


def test_a_revoked_key_is_refused_on_its_next_claim(with_redis, make_agent, paths) -> None:
    agent = make_agent()
    assert _claim(agent).status_code == 204
    assert _claim(agent).status_code == 204 and paths.lean == 1  # cached: lean
    key = ApiKey.objects.get(node_id=agent.node_id)
    revoke_key(key)
    refused = _claim(agent)
    assert refused.status_code == 401 and refused.json()["error"] == "authentication_failed"
    # a stale entry written back after the revocation committed (a racing request) is
    # kept unused by the bypass mark, in the script too
    key.revoked_at = None
    key_cache.store(key)
    assert _claim(agent).status_code == 401 and paths.lean == 1


def test_a_user_key_is_refused_as_before(with_redis, make_user, paths) -> None:
    from tests.marketplace.helpers import client_for

    _, plaintext = make_user("provider")
    client = client_for(plaintext)
    assert client.get("/api/v1/nodes/").status_code == 200  # cached
    refused = client.post(URL)
    assert refused.status_code == 403 and paths.lean == 0


def test_the_throttle_counts_both_paths_and_answers_429(
    with_redis, make_agent, paths, monkeypatch
) -> None:
    small = KeyRateThrottle.THROTTLE_RATES | {"key": "4/hour"}
    monkeypatch.setattr(KeyRateThrottle, "THROTTLE_RATES", small)
    agent = make_agent()
    statuses = [_claim(agent).status_code for _ in range(4)]  # the first through DRF
    assert statuses == [204] * 4 and paths.lean == 3
    refused = _claim(agent)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"] == "throttled"
    assert _claim(agent, "max=99").status_code == 429  # the throttle comes first
    # the refused took their counts back
    assert counted(with_redis, KeyRateThrottle(), ApiKey.objects.get(node_id=agent.node_id)) == 4


def test_without_redis_the_drf_view_answers(settings, make_agent, submit, paths) -> None:
    settings.REDIS_URL = ""
    agent = make_agent()
    submit(SPEC)
    assert _claim(agent, "max=2").status_code == 200
    assert _claim(agent, "max=2").status_code == 200
    assert paths.lean == 0 and len(_held(agent)) == 4
