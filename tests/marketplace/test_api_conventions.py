"""Pagination and throttling as every list and every client sees them."""

from __future__ import annotations

import pytest

from marketplace.api import rate_counts
from marketplace.api.throttles import HeartbeatThrottle


def test_job_list_is_paginated(buyer, submit) -> None:
    for _ in range(3):
        submit()
    page = buyer.get("/api/v1/jobs/?limit=2").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    rest = buyer.get("/api/v1/jobs/?limit=2&offset=2").json()
    assert len(rest["results"]) == 1 and rest["next"] is None


@pytest.fixture
def tight_heartbeat_limit(monkeypatch):
    monkeypatch.setattr(HeartbeatThrottle, "THROTTLE_RATES", {"heartbeat": "2/min"})
    rate_counts.store().clear()
    yield
    rate_counts.store().clear()


def test_rate_limited_heartbeats_get_429_with_retry_after(make_agent, tight_heartbeat_limit):
    agent = make_agent()
    assert agent.heartbeat().status_code == 200
    assert agent.heartbeat().status_code == 200
    response = agent.heartbeat()
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert response.json()["error"] == "throttled" and response.json()["detail"]
    # limits are per key: another node is unaffected
    assert make_agent().heartbeat().status_code == 200
