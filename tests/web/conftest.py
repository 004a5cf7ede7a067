"""Fixtures for the web pages: users with passwords and session logins, nodes, a job."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.accounts.models import User
from marketplace.accounts.services import create_user, issue_node_key
from marketplace.jobs.models import Job
from marketplace.jobs.submission import submit_job
from marketplace.ledger.services import grant_credit
from marketplace.nodes.enrollment import create_enrollment_token
from marketplace.nodes.models import Node
from marketplace.nodes.services import register_node
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import HARDWARE, SMALL_SPEC

PASSWORD = "correct-horse-battery-9"
CHROMIUM = Path("/usr/lib/chromium/chromium")  # Debian's; never `playwright install`
_names = itertools.count()


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    def make(role: str = "buyer", credit: str = "100") -> User:
        user = create_user(f"web{role}{next(_names)}", role)
        user.set_password(PASSWORD)
        user.save()
        if role in ("buyer", "operator") and Decimal(credit) > 0:
            grant_credit(user=user, amount=credit, memo="test credit", operator=None)
        return user

    return make


@pytest.fixture
def login() -> Callable[[User], Client]:
    def do(user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return do


@pytest.fixture
def make_node() -> Callable[..., Node]:
    def make(owner: User, price: str = "0.40", rtt_ms: float = 20.0, **extra: Any) -> Node:
        kind = extra.pop("kind", "platform")
        node, _ = register_node(
            owner=owner,
            name=f"node-{next(_names)}",
            kind=kind,
            enrollment_token=create_enrollment_token(operator=None)[1]
            if kind == "platform"
            else None,
            hardware=HARDWARE,
            benchmark={"fp32_tflops": 80, "train_samples_per_s": {"mlp": 40000.0}},
            network={"rtt_ms": rtt_ms, "up_mbps": 100, "down_mbps": 300},
            price_per_gpu_hour=Decimal(price),
            availability={},
        )
        return node

    return make


@pytest.fixture
def make_job(django_capture_on_commit_callbacks) -> Callable[..., Job]:
    def make(buyer: User, **fields: Any) -> Job:
        args = {"spec_data": SMALL_SPEC, "budget": Decimal("10"), "tier": "platform",
                "max_price_per_gpu_hour": Decimal("1.00")} | fields  # fmt: skip
        # round 1 opens in a task sent on commit (jobs/preparation.py): run it as a commit would
        with django_capture_on_commit_callbacks(execute=True):
            return submit_job(buyer=buyer, **args)

    return make


def agent_for(node: Node) -> Agent:
    """The test stand-in agent (real local training over the agent API) for a node."""
    _, key = issue_node_key(node)
    return Agent(APIClient(), node.pk, key)


def run_until_idle(agents: list[Agent], limit: int = 100) -> int:
    done = 0
    for _ in range(limit):
        worked = False
        for agent in agents:
            task = agent.claim()
            if task is not None:
                response = agent.work(task)
                assert response.status_code == 202, (
                    response.content
                )  # received; eager Celery checks it
                worked, done = True, done + 1
        if not worked:
            return done
    raise AssertionError("work never ran out")


@pytest.fixture
def browser(monkeypatch) -> Iterator:
    """Debian's chromium through Playwright."""
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # plain synchronous code all the same
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()
