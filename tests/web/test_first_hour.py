"""The first hour in a real browser (Debian's chromium through Playwright): the API docs work
with no internet, and a new buyer's first job trains with the form's default values against
real agents (issue #37: the default price of 1.00 stranded it under nodes asking 1.20-3.00).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.db import connections

from marketplace.accounts.models import User
from marketplace.jobs.models import Job
from marketplace.ledger.services import grant_credit
from tests.live_agents import live_agent
from tests.web.test_browser import CHROMIUM, LAPTOP, Console, _signup

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]

LOCAL = {"localhost", "127.0.0.1", "[::1]", "::1"}


@pytest.fixture
def offline_page(monkeypatch) -> Iterator:
    """A page whose every request off this machine is aborted, as with no internet; the
    aborted URLs are in `page.external`."""
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context(viewport=LAPTOP)
        external: list[str] = []

        def route(r) -> None:
            if urlsplit(r.request.url).hostname in LOCAL or r.request.url.startswith("data:"):
                r.continue_()
            else:
                external.append(r.request.url)
                r.abort("internetdisconnected")

        context.route("**/*", route)
        page = context.new_page()
        page.external = external
        try:
            yield page
        finally:
            context.close()
            browser.close()
            connections.close_all()


def test_api_docs_work_offline(live_server, offline_page) -> None:
    page = offline_page
    console = Console()
    console.watch(page)
    page.goto(f"{live_server.url}/api/v1/docs/")
    # Swagger UI lists the operations once its bundle (served by the server) has run
    page.wait_for_selector(".opblock", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert len(paths) > 20
    assert any(p.replace("\u200b", "") == "/api/v1/jobs/{id}/cancel" for p in paths), paths
    assert page.external == [] and console.errors == []


def test_a_new_buyers_first_job_trains_with_the_forms_defaults(
    live_server, offline_page, tmp_path, monkeypatch, settings
) -> None:
    base = live_server.url
    settings.GPUFLEX = settings.GPUFLEX | {"EVENT_KEEPALIVE_S": 1.0}  # streams let go soon
    page = offline_page
    console = Console()
    console.watch(page)
    provider = User.objects.create_user("rig-owner", password="x-Passw0rd-x", role="provider")
    from marketplace.accounts.services import issue_user_key

    _, key = issue_user_key(provider)
    # two nodes asking prices in the README's realistic range (1.20-3.00 per GPU-hour)
    agents = [
        live_agent(tmp_path, f"rig-{i}", base, key, monkeypatch, price=price, fp32_tflops=1.0)
        for i, price in enumerate(("1.40", "1.60"))
    ]
    for agent in agents:
        agent.start()
    try:
        _signup(page, base, "newcomer", "buyer")
        grant_credit(user=User.objects.get(username="newcomer"), amount=Decimal("20"),
                     memo="welcome credit", operator=None)  # fmt: skip
        for _ in range(300):  # both nodes registered and online (their first heartbeat)
            if provider.nodes.count() == 2:
                break
            page.wait_for_timeout(200)
        page.goto(f"{base}/jobs/new/")
        # the defaults, as a newcomer leaves them: the price is the market's median
        assert page.input_value("#id_max_price_per_gpu_hour") == "1.5000"
        assert page.input_value("#id_tier") == "hybrid"
        # only fewer rounds than the example's 10, to keep the test short
        spec = page.input_value("#id_spec")
        assert "max_rounds: 10" in spec
        page.fill("#id_spec", spec.replace("max_rounds: 10", "max_rounds: 2"))
        page.wait_for_selector("#estimate-figures:not([hidden])")
        page.click("#submit-btn")
        page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
        page.wait_for_selector("#job-status.completed", timeout=240_000)
        job = Job.objects.get(buyer__username="newcomer")
        assert job.max_price_per_gpu_hour == Decimal("1.5") and job.tier == "hybrid"
        assert job.rounds_done == 2 and job.model_hash
        assert page.external == [] and console.errors == []
    finally:
        for agent in agents:
            agent.stop()
