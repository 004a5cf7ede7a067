"""Live pushes: doorbells rung on commit, and the Server-Sent Events streams of the job,
earnings and operator pages (marketplace/events)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest
import redis
from django.core.signals import request_finished
from django.db import close_old_connections

from marketplace.client import sse_messages
from marketplace.events import topics
from marketplace.events.doorbell import Listener, ring
from marketplace.jobs.services import cancel_job, pause_job
from marketplace.ledger import accounts
from marketplace.ledger.posting import post
from marketplace.ledger.services import grant_credit
from tests.web.conftest import agent_for, run_until_idle

REDIS_URL = "redis://127.0.0.1:6379/12"


def _redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(params=["file", "redis"])
def bell(request, settings) -> Iterator[str]:
    """Both doorbells: the embedded setup's file, and Redis pub/sub under a fresh prefix."""
    if request.param == "redis":
        if not _redis_up():
            pytest.skip("Redis is not running on 127.0.0.1:6379")
        settings.REDIS_URL = REDIS_URL
        settings.GPUFLEX = settings.GPUFLEX | {"REDIS_PREFIX": f"test-{uuid.uuid4().hex}"}
    else:
        settings.REDIS_URL = ""
    yield request.param


def _close(response) -> None:
    """End a stream as the server does when its client goes (as Django's test client does,
    without closing the test's database connection inside its transaction)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def _frames(response) -> Iterator[dict]:
    """The `state` messages of a streaming response, decoded, as they come."""

    def lines() -> Iterator[str]:
        for chunk in response.streaming_content:
            yield from chunk.decode().split("\n")

    for event, data in sse_messages(lines()):
        assert event == "state"
        yield json.loads(data)


def test_sse_messages_follow_the_wire_format() -> None:
    wire = [
        "retry: 1000",
        "",
        ": keepalive",
        "",
        "id: 3",
        "event: state",
        'data: {"a":',
        "data: 1}",
        "",
        "data: plain\r",
        "",
    ]
    assert list(sse_messages(iter(wire))) == [("state", '{"a":\n1}'), ("message", "plain")]


def test_a_listener_hears_its_topics_rung(bell) -> None:
    listener = Listener([topics.job("a")])
    others = Listener([topics.job("b")])
    try:
        assert listener.wait(0) is False
        ring([topics.job("a"), topics.job("a")])
        # a Redis message takes a moment to arrive: wait for it (at once when it is there)
        assert listener.wait(10) is True
        assert listener.wait(0) is False  # one topic twice in a ring is one message
        ring([topics.job("b")])
        assert others.wait(10) is True  # delivered (to b's listener, which hears it)...
        # ...and a's listener hears it only through the embedded bell, one file for all topics
        assert listener.wait(0 if bell == "redis" else 10) is (bell == "file")
    finally:
        listener.close()
        others.close()


def test_changes_ring_their_topics_after_commit(
    make_user, make_job, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    rung: list[list[str]] = []
    monkeypatch.setattr("marketplace.events.services.ring", lambda names: rung.append(names))
    buyer = make_user("buyer")
    job = make_job(buyer)
    rung.clear()
    with django_capture_on_commit_callbacks(execute=False) as pending:
        pause_job(job)
    assert rung == []  # nothing rings before the commit
    for callback in pending:
        callback()
    assert [topics.job(job.pk), topics.OPERATOR] in rung
    rung.clear()
    with django_capture_on_commit_callbacks(execute=True):
        grant_credit(user=buyer, amount="5", memo="more", operator=None)
    assert [topics.money(buyer.pk), topics.OPERATOR] in rung


def test_the_job_stream_pushes_each_change_and_ends_with_the_job(
    bell, make_user, make_job, login, django_capture_on_commit_callbacks
) -> None:
    buyer = make_user("buyer")
    job = make_job(buyer)
    response = login(buyer).get(f"/jobs/{job.pk}/events/")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    frames = _frames(response)
    first = next(frames)
    assert first["status"] == "running" and first["rounds_done"] == 0
    with django_capture_on_commit_callbacks(execute=True):
        pause_job(job)
    assert next(frames)["status"] == "paused"
    with django_capture_on_commit_callbacks(execute=True):
        cancel_job(job)
    assert next(frames)["status"] == "cancelled"
    assert next(frames, None) is None  # an ended job changes no more: the stream closes
    _close(response)


def test_the_job_stream_shows_a_round_closing(
    bell, make_user, make_job, make_node, login, django_capture_on_commit_callbacks
) -> None:
    buyer = make_user("buyer")
    job = make_job(buyer, spec_data=_one_round_spec())
    agents = [agent_for(make_node(make_user("provider"))) for _ in range(3)]
    response = login(buyer).get(f"/jobs/{job.pk}/events/")
    frames = _frames(response)
    assert next(frames)["rounds_done"] == 0
    with django_capture_on_commit_callbacks(execute=True):
        run_until_idle(agents)
    last = next(frames)
    while last["status"] == "running":
        last = next(frames)  # leases and uploads came first
    assert last["status"] == "completed" and last["rounds_done"] == 1
    assert last["rounds"] and last["has_model"]
    _close(response)


def test_the_pushed_payload_carries_provenance_and_the_ended_jobs_nodes(
    bell, make_user, make_job, make_node, login, django_capture_on_commit_callbacks
) -> None:
    """Provenance and node states are in the payload the page redraws from, so they change
    without a reload: the chain as rounds close, and on an ended job the nodes that worked
    on it rather than the market's nodes as they stood when its last round closed."""
    buyer = make_user("buyer")
    job = make_job(buyer, spec_data=_one_round_spec())
    agents = [agent_for(make_node(make_user("provider"))) for _ in range(3)]
    response = login(buyer).get(f"/jobs/{job.pk}/events/")
    frames = _frames(response)
    first = next(frames)
    assert first["provenance"]["records"] == [] and first["provenance"]["ok"] is None
    assert first["node_states"]["summary"] == "3 idle"
    with django_capture_on_commit_callbacks(execute=True):
        run_until_idle(agents)
    last = next(frames)
    while last["status"] == "running":
        last = next(frames)
    assert last["status"] == "completed"
    chain = last["provenance"]
    assert chain["ok"] is True and chain["count"] == 1
    assert [r["round"] for r in chain["records"]] == [1]
    assert chain["url"] == f"/jobs/{job.pk}/provenance/"
    assert last["node_states"]["summary"] == (
        "completed: 3 nodes worked on this job; none works on it now"
    )
    assert {n["state"] for n in last["nodes"]} == {"done"}
    # money as every surface shows it: the digits it has, never rounded to 0.00
    spent = last["cost"]["shown"]["spent"]
    assert Decimal(spent) == Decimal(last["cost"]["spent"]).quantize(Decimal(spent)) > 0
    _close(response)


def test_a_buyer_cannot_stream_another_buyers_job(make_user, make_job, login) -> None:
    job = make_job(make_user("buyer"))
    assert login(make_user("buyer")).get(f"/jobs/{job.pk}/events/").status_code == 404


def test_the_earnings_stream_pushes_credited_money(
    bell, make_user, login, django_capture_on_commit_callbacks
) -> None:
    provider = make_user("provider")
    response = login(provider).get("/earnings/events/")
    frames = _frames(response)
    assert Decimal(next(frames)["balances"]["earnings"]) == 0
    with django_capture_on_commit_callbacks(execute=True):
        post(
            f"test-earn-{provider.pk}",
            "grant",
            [
                (accounts.external_grants(), Decimal("-1.5")),
                (accounts.provider_earnings(provider), Decimal("1.5")),
            ],
        )
    assert Decimal(next(frames)["balances"]["earnings"]) == Decimal("1.5")
    _close(response)


def test_the_operator_stream_counts_jobs(
    bell, make_user, make_job, login, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    monkeypatch.setattr("marketplace.web.views.operator.LIVE_INTERVAL_S", 0.0)
    operator = make_user("operator")
    assert login(make_user("buyer")).get("/operator/events/").status_code == 403
    response = login(operator).get("/operator/events/")
    frames = _frames(response)
    assert next(frames)["jobs_by_status"] == {}
    job = make_job(make_user("buyer"))
    assert next(frames)["jobs_by_status"] == {"running": 1}
    with django_capture_on_commit_callbacks(execute=True):
        cancel_job(job)
    state = next(frames)
    assert state["jobs_by_status"] == {"cancelled": 1}
    assert state["jobs"][0]["status"] == "cancelled" and state["ledger"]["ok"]
    _close(response)


def test_streams_beyond_the_process_cap_get_503_and_slots_come_back(
    settings, make_user, make_job, login
) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"EVENT_STREAMS_PER_PROCESS": 1}
    buyer = make_user("buyer")
    job = make_job(buyer)
    client = login(buyer)
    held = client.get(f"/jobs/{job.pk}/events/")
    assert held.status_code == 200
    busy = client.get(f"/jobs/{job.pk}/events/")
    assert busy.status_code == 503 and busy["Retry-After"] == "30"
    _close(held)  # never read: its slot is freed all the same
    again = client.get(f"/jobs/{job.pk}/events/")
    assert again.status_code == 200
    _close(again)


@pytest.mark.django_db(transaction=True)  # a WSGI request closes the connection a test holds
def test_the_api_streams_the_job_to_the_sdk(bell, make_user, make_job) -> None:
    import httpx
    from django.core.wsgi import get_wsgi_application

    from marketplace.accounts.services import issue_user_key
    from marketplace.client import Client

    buyer = make_user("buyer")
    job = make_job(buyer)
    _, key = issue_user_key(buyer)
    transport = httpx.WSGITransport(app=get_wsgi_application())
    with Client("http://testserver", key, transport=transport) as sdk:
        stream = sdk.events(str(job.pk))
        assert next(stream)["status"] == "running"
        stream.close()
        with pytest.raises(Exception) as other:
            other_buyer = make_user("buyer")
            _, other_key = issue_user_key(other_buyer)
            with Client("http://testserver", other_key, transport=transport) as stranger:
                next(stranger.events(str(job.pk)))
        assert getattr(other.value, "status", None) == 404


def _one_round_spec() -> dict:
    from tests.marketplace.helpers import SMALL_SPEC

    return SMALL_SPEC | {"rounds": {"max_rounds": 1}}


def test_redis_prefix_isolates_deployments(settings) -> None:
    if not _redis_up():
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    settings.REDIS_URL = REDIS_URL
    settings.GPUFLEX = settings.GPUFLEX | {"REDIS_PREFIX": f"test-{uuid.uuid4().hex}"}
    listener = Listener([topics.OPERATOR])
    try:
        other = redis.Redis.from_url(REDIS_URL)
        other.publish(f"someone-else:events:{topics.OPERATOR}", b"1")
        assert listener.wait(0) is False
    finally:
        listener.close()
