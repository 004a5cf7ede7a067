"""The job page in a real browser (Debian's chromium through Playwright): every panel follows
the job without a reload, the provenance chain and the node states included.

The job is driven from the test through the agent API (the stand-in agents of
tests/marketplace/agents.py, one round at a time), not by real agent processes, so the test
takes seconds: what it checks is the page, not the training.
"""

from __future__ import annotations

import pytest
from django.db import connections

from marketplace.jobs.models import Job
from tests.marketplace.helpers import SMALL_SPEC
from tests.web.conftest import agent_for, run_until_idle
from tests.web.test_browser import CHROMIUM, LAPTOP, Console, _login

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]


def _until_round_closes(agents, job: Job, number: int, limit: int = 50) -> None:
    """Claim and finish tasks until the job's round `number` has closed."""
    for _ in range(limit):
        job.refresh_from_db()
        if job.rounds_done >= number:
            return
        for agent in agents:
            task = agent.claim()
            if task is not None:
                assert agent.work(task).status_code == 202  # received, checked on commit
    raise AssertionError(f"round {number} never closed")


def test_provenance_and_node_states_follow_the_job_without_reload(
    live_server, browser, make_user, make_node, make_job, settings
) -> None:
    # a page's stream notices its closed page at the next keepalive and frees its connection
    settings.GPUFLEX = settings.GPUFLEX | {"EVENT_KEEPALIVE_S": 1.0}
    buyer = make_user("buyer")
    job = make_job(buyer, spec_data=SMALL_SPEC | {"rounds": {"max_rounds": 2}})
    agents = [agent_for(make_node(make_user("provider"))) for _ in range(3)]
    console = Console()
    context = browser.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        console.watch(page)
        _login(page, live_server.url, buyer.username)
        page.goto(f"{live_server.url}/jobs/{job.pk}/")
        page.evaluate("window.__sameDocument = true")  # gone if the page reloads
        status = page.locator("[data-testid=provenance-status]")
        assert status.inner_text() == "no rounds yet"
        assert page.locator("#provenance-rows tr").count() == 0
        assert page.inner_text("#node-summary") == "3 idle"

        # round 1 closes: its record appears, and the chain is verified, on the open page
        _until_round_closes(agents, job, 1)
        page.wait_for_selector("#provenance-rows tr", timeout=30_000)
        page.wait_for_function(
            "document.getElementById('provenance-status').textContent === 'chain verified'",
            timeout=30_000,
        )
        assert page.locator("#provenance-rows tr").count() == 1
        assert page.is_hidden("#provenance-empty")

        # the job completes: two records, and the nodes are those that worked on it, not the
        # market's nodes as they were when the last round closed
        run_until_idle(agents)
        job.refresh_from_db()
        assert job.status == "completed" and job.rounds_done == 2
        page.wait_for_selector("#job-status.completed", timeout=30_000)
        page.wait_for_function(
            "document.querySelectorAll('#provenance-rows tr').length === 2", timeout=30_000
        )
        assert page.locator("#provenance-rows tr td:first-child").all_inner_texts() == ["1", "2"]
        assert page.inner_text("#node-summary") == (
            "completed: 3 nodes worked on this job; none works on it now"
        )
        assert page.locator("#node-rows .badge.done").count() == 3
        assert page.evaluate("window.__sameDocument") is True  # never reloaded
        assert console.errors == []
    finally:
        context.close()  # the page's stream before the live server and its database go
        connections.close_all()
