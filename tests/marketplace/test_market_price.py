"""A job's price cap defaults to the market's (the median asking price of the online nodes
that fit it), and a job no node takes says why in figures on the API (and so on the job page
and in `gpuflex submit --follow`, which show the same `node_states.summary`)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from marketplace.jobs.market import PRICE_WITHOUT_MARKET, market_price, shown_price
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db


def summary(buyer, job_id: str) -> str:
    return buyer.get(f"/api/v1/jobs/{job_id}/").json()["node_states"]["summary"]


def test_a_job_without_a_price_gets_the_median_of_the_nodes_that_fit(
    buyer, make_agent, submit
) -> None:
    assert market_price() == PRICE_WITHOUT_MARKET  # no node online yet
    for price in ("1.20", "1.60", "3.00"):
        make_agent(price=price)
    job = submit(max_price_per_gpu_hour=None)
    assert Decimal(job["max_price_per_gpu_hour"]) == Decimal("1.60")
    assert "no node" not in summary(buyer, job["id"])
    # a platform job's market is the platform nodes alone
    make_agent(kind="platform", price="2.50")
    job = submit(max_price_per_gpu_hour=None, tier="platform")
    assert Decimal(job["max_price_per_gpu_hour"]) == Decimal("2.50")
    # left out of the body entirely: the same
    body = {"spec": SMALL_SPEC, "budget": "10"}
    r = buyer.post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    assert Decimal(r.json()["max_price_per_gpu_hour"]) == Decimal("2.05")  # 1.20 1.60 2.50 3.00


def test_a_job_no_node_takes_says_why_in_figures(buyer, make_agent, submit) -> None:
    job = submit(max_price_per_gpu_hour="1.00")
    assert summary(buyer, job["id"]) == "no node online: the job waits for one to come online"
    make_agent(price="1.60")
    make_agent(price="1.20")
    assert summary(buyer, job["id"]) == (
        "no node online at or under 1.00; the cheapest that fits asks 1.20 (raise the job's "
        "max price to use it)"
    )
    # the job page says the same, where the buyer watches the job
    web = Client()
    web.force_login(Job.objects.get(pk=job["id"]).buyer)
    page = web.get(f"/jobs/{job['id']}/").content.decode()
    assert "no node online at or under 1.00; the cheapest that fits asks 1.20" in page
    big = submit(SMALL_SPEC | {"requirements": {"min_vram_gb": 100}}, max_price_per_gpu_hour="5")
    said = summary(buyer, big["id"])
    assert said.startswith("no node online has what the job requires:") and "100 GB" in said
    # once a node fits, the sentence is the nodes' states again
    Node.objects.update(price_per_gpu_hour=Decimal("0.90"))
    assert summary(buyer, job["id"]).startswith("2 idle")


def test_prices_are_shown_as_people_write_them() -> None:
    assert shown_price(Decimal("1.0000")) == "1.00"
    assert shown_price(Decimal("1.2")) == "1.20"
    assert shown_price(Decimal("0.0125")) == "0.0125"


def test_the_submit_form_defaults_to_the_market_price(buyer, make_agent) -> None:
    from marketplace.accounts.models import User

    for price in ("1.20", "2.00"):
        make_agent(price=price)
    client = Client()
    client.force_login(User.objects.filter(role="buyer").first())
    page = client.get("/jobs/new/").content.decode()
    assert 'name="max_price_per_gpu_hour" value="1.6000"' in page
    assert "median asking price of the nodes online now (1.60)" in page
    assert Job.objects.count() == 0
