"""Fixtures: users with keys, registered nodes as agents, and a small digits job."""

from __future__ import annotations

import itertools
import socket
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from rest_framework.test import APIClient

from marketplace.accounts.services import create_user, issue_user_key
from marketplace.ledger.services import grant_credit
from marketplace.nodes.enrollment import create_enrollment_token
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC, client_for

_names = itertools.count()


@pytest.fixture
def make_user(db: None) -> Callable[..., tuple[Any, str]]:
    def make(role: str = "buyer") -> tuple[Any, str]:
        user = create_user(f"{role}{next(_names)}", role)
        _, key = issue_user_key(user)
        if role in ("buyer", "operator"):
            grant_credit(user=user, amount="1000", memo="test credit", operator=None)
        return user, key

    return make


@pytest.fixture
def buyer(make_user: Callable[..., tuple[Any, str]]) -> APIClient:
    _, key = make_user("buyer")
    return client_for(key)


@pytest.fixture
def provider(make_user: Callable[..., tuple[Any, str]]) -> APIClient:
    _, key = make_user("provider")
    return client_for(key)


@pytest.fixture
def make_agent(provider: APIClient) -> Callable[..., Agent]:
    def make(kind: str = "volunteer", price: str = "0.40", **extra: Any) -> Agent:
        body = {
            "name": f"node-{next(_names)}",
            "kind": kind,
            "hardware": HARDWARE,
            "benchmark": {"fp32_tflops": 80},
            "network": {"rtt_ms": 20, "up_mbps": 100, "down_mbps": 300},
            "price_per_gpu_hour": price,
            "availability": {"hours": "always"},
        } | extra
        if kind == "platform":  # enrolled as an operator enrolls one: with a token
            body.setdefault("enrollment_token", create_enrollment_token(operator=None)[1])
        response = provider.post("/api/v1/nodes/", body, format="json")
        assert response.status_code == 201, response.content
        data = response.json()
        return Agent(APIClient(), data["id"], data["node_key"])

    return make


@pytest.fixture
def submit(buyer: APIClient, django_capture_on_commit_callbacks) -> Callable[..., dict[str, Any]]:
    def do(spec: dict[str, Any] | None = None, client: APIClient | None = None, **fields: Any):
        body = {"spec": spec or SMALL_SPEC, "max_price_per_gpu_hour": "1.00", "budget": "10"}
        body |= fields
        # the job's model is built by a task sent on commit: a test inside a transaction
        # runs it as the commit would (a transactional test has run it already)
        with django_capture_on_commit_callbacks(execute=True):
            response = (client or buyer).post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        return response.json()

    return do


@pytest.fixture
def own_media(tmp_path, settings) -> str:
    """A media folder of the test's own, so it can count what was stored."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.STORAGES = settings.STORAGES | {
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": settings.MEDIA_ROOT},
        }
    }
    return settings.MEDIA_ROOT


@pytest.fixture
def with_redis(settings):
    """Redis presence and key cache on (the lean agent path with them), under a prefix no
    other test uses; its keys deleted afterwards. Skipped where no Redis runs."""
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    prefix = f"test-{uuid.uuid4().hex}"
    settings.REDIS_URL = "redis://127.0.0.1:6379/11"
    settings.GPUFLEX = settings.GPUFLEX | {
        "REDIS_PREFIX": prefix, "PRESENCE_IN_REDIS": True, "KEY_CACHE_S": 300.0,
    }  # fmt: skip
    r = redis.Redis.from_url(settings.REDIS_URL)
    yield r
    for k in r.scan_iter(f"{prefix}:*"):
        r.delete(k)
