"""#20 finding 3: money amounts are bounded at parse to what the ledger stores exactly.

An operator grant of 1e15 returned 500 after it was committed; 99999999999999.999999 was
stored as 100000000000000, after which reconcile, the balance and the statement returned 500;
a payout of 1e30 returned 500. Now each is a 400 naming the field, nothing is stored, and
the largest allowed amount reads back exactly, on PostgreSQL and on SQLite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from marketplace.ledger.money import MAX_AMOUNT, parse_amount
from tests.marketplace import money_scenario

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1e15", "at most 999999999.999999"),
        ("99999999999999.999999", "at most 999999999.999999"),
        ("1e30", "at most"),
        ("1E+999999999", "at most"),
        ("0.0000005", "6 decimal places"),
        ("NaN", "not a decimal number"),
        ("sNaN", "not a decimal number"),
        ("Infinity", "not a decimal number"),
        (Decimal("Infinity"), "not a decimal number"),
        ("0", "positive"),
        ("-1", "positive"),
        (1.5, "not a float"),
        (True, "not a decimal number"),
        ("1" * 41, "not a decimal number"),
    ],
)
def test_parse_amount_refuses_what_the_ledger_cannot_hold(value: object, words: str) -> None:
    with pytest.raises(ValueError, match="budget") as err:
        parse_amount(value, field="budget")
    assert words in str(err.value)


def test_parse_amount_keeps_the_largest_and_smallest_amounts_exactly() -> None:
    assert parse_amount(str(MAX_AMOUNT)) == Decimal("999999999.999999")
    assert parse_amount("0.000001") == Decimal("0.000001")
    assert parse_amount("1E+3") == Decimal("1000")
    assert parse_amount(7) == Decimal("7")


def _check(out: dict[str, Any]) -> None:
    for kind in ("grants", "payouts"):
        for amount, (code, fields) in out[kind].items():
            assert (code, fields) == (400, ["amount"]), (kind, amount, code, fields)
    assert all(said != "granted" for said in out["cli"].values()), out["cli"]
    assert out["stored_unchanged"]
    assert out["max_grant"] == 201
    assert out["balance"]["available"] == out["max_amount"] == "999999999.999999"
    assert out["statement"] == 200
    assert out["reconcile"]["ok"] is True, out["reconcile"]


@pytest.mark.django_db
def test_hostile_amounts_are_400s_that_store_nothing_on_the_test_database() -> None:
    _check(money_scenario.run())


def test_hostile_amounts_are_400s_that_store_nothing_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env |= {"GPUFLEX_DATA_DIR": str(tmp_path), "PYTHONPATH": str(HERE.parent.parent)}
    out = subprocess.run(
        [sys.executable, str(HERE / "sqlite_money.py")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    _check(json.loads(out.stdout.strip().splitlines()[-1]))


BAD_DECIMALS = ["NaN", "Infinity", "-Infinity", "1e30", "0.00001", "100000000000", ""]


@pytest.mark.django_db
@pytest.mark.parametrize("value", BAD_DECIMALS)
def test_budgets_and_prices_are_bounded_too(buyer, provider, value: str) -> None:
    """The siblings of the ledger's amounts: a job's budget and price cap, a node's price."""
    from marketplace.jobs.models import Job
    from marketplace.nodes.models import Node
    from tests.marketplace.helpers import HARDWARE, SMALL_SPEC

    # an empty price cap is a left-out one, the market's price (#37); an empty budget is not
    fields = ("budget", "max_price_per_gpu_hour") if value else ("budget",)
    for field in fields:
        body = {"spec": SMALL_SPEC, "max_price_per_gpu_hour": "1.00", "budget": "1"}
        r = buyer.post("/api/v1/jobs/", body | {field: value}, format="json")
        assert r.status_code == 400 and field in r.json()["fields"], (field, r.content)
    node = {
        "name": "n",
        "kind": "volunteer",
        "hardware": HARDWARE,
        "price_per_gpu_hour": value,
        "availability": {"hours": "always"},
    }
    r = provider.post("/api/v1/nodes/", node, format="json")
    assert r.status_code == 400 and "price_per_gpu_hour" in r.json()["fields"], r.content
    assert not Job.objects.exists() and not Node.objects.exists()


# -- #38 finding 11: amounts and counts in other scripts' digits; a price of 0 ---------------

# what int() and Decimal() read as 12: Arabic-Indic, full-width, Devanagari digits
FOREIGN_12 = ["١٢", "１２", "१२"]


@pytest.mark.parametrize("value", FOREIGN_12)
def test_parse_amount_takes_ascii_digits_only(value: str) -> None:
    assert Decimal(value) == 12  # what the ledger's parser used to keep
    with pytest.raises(ValueError, match="digits 0-9"):
        parse_amount(value, field="amount")
    with pytest.raises(ValueError, match="digits 0-9"):
        parse_amount(value + ".5", field="amount")


@pytest.mark.django_db
@pytest.mark.parametrize("value", FOREIGN_12)
def test_credit_grants_and_payouts_refuse_foreign_digits(make_user, value: str) -> None:
    from django.core.management import CommandError, call_command

    from marketplace.ledger.models import Transaction
    from tests.marketplace.helpers import client_for

    _, operator_key = make_user("operator")
    buyer, _ = make_user("buyer")
    _, provider_key = make_user("provider")
    before = Transaction.objects.count()
    body = {"username": buyer.username, "amount": value}
    r = client_for(operator_key).post("/api/v1/operator/credits", body, format="json")
    assert r.status_code == 400 and "amount" in r.json()["fields"], r.content
    body = {"amount": value, "wallet_address": "0x" + "a" * 40, "idempotency_key": "p"}
    r = client_for(provider_key).post("/api/v1/payouts/", body, format="json")
    assert r.status_code == 400 and "amount" in r.json()["fields"], r.content
    with pytest.raises(CommandError, match="digits 0-9"):
        call_command("grant_credit", buyer.username, value, verbosity=0)
    assert Transaction.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize("value", FOREIGN_12)
def test_budgets_prices_and_counts_refuse_foreign_digits(buyer, provider, make_user, value):
    """The API's number fields: a job's budget and price cap, a node's price, an enrollment
    token's uses, an upload's size, and the query parameters."""
    from marketplace.jobs.models import Job
    from marketplace.nodes.models import Node
    from marketplace.uploads.models import Upload
    from tests.marketplace.helpers import HARDWARE, SMALL_SPEC, client_for

    # an empty price cap is a left-out one, the market's price (#37); an empty budget is not
    fields = ("budget", "max_price_per_gpu_hour") if value else ("budget",)
    for field in fields:
        body = {"spec": SMALL_SPEC, "max_price_per_gpu_hour": "1.00", "budget": "1"}
        r = buyer.post("/api/v1/jobs/", body | {field: value}, format="json")
        assert r.status_code == 400 and field in r.json()["fields"], (field, r.content)
        assert "digits 0-9" in r.json()["fields"][field][0]
    node = {"name": "n", "kind": "volunteer", "hardware": HARDWARE,
            "price_per_gpu_hour": value, "availability": {"hours": "always"}}  # fmt: skip
    r = provider.post("/api/v1/nodes/", node, format="json")
    assert r.status_code == 400 and "price_per_gpu_hour" in r.json()["fields"], r.content
    _, operator_key = make_user("operator")
    r = client_for(operator_key).post(
        "/api/v1/operator/enrollment-tokens", {"uses": value}, format="json"
    )
    assert r.status_code == 400 and "uses" in r.json()["fields"], r.content
    upload = {"filename": "d.csv", "size": value, "sha256": "0" * 64}
    r = buyer.post("/api/v1/uploads/", upload, format="json")
    assert r.status_code == 400 and "size" in r.json()["fields"], r.content
    for query in (f"limit={value}", f"offset={value}"):
        r = buyer.get(f"/api/v1/jobs/?{query}")
        assert r.status_code == 400 and "digits 0-9" in r.content.decode(), (query, r.content)
    r = provider.get(f"/api/v1/ledger/earnings?days={value}")
    assert r.status_code == 400 and "days" in r.json()["fields"], r.content
    assert not Job.objects.exists() and not Node.objects.exists()
    assert not Upload.objects.exists()
    # the same in ASCII is taken
    assert buyer.get("/api/v1/jobs/?limit=12").status_code == 200
    assert provider.get("/api/v1/ledger/earnings?days=12").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("value", FOREIGN_12)
def test_the_web_forms_refuse_foreign_digits(value: str) -> None:
    from django.test import Client

    from marketplace.accounts.services import create_user
    from marketplace.jobs.models import Job
    from marketplace.uploads.models import Upload

    user = create_user(f"web{len(value)}{ord(value[0])}", "buyer", "")
    web = Client()
    web.force_login(user)
    for field in ("budget", "max_price_per_gpu_hour"):
        form = {"spec": "name: x", "tier": "hybrid", "budget": "1", "max_price_per_gpu_hour": "1"}
        page = web.post("/jobs/new/", form | {field: value})
        assert page.status_code == 400 and "digits 0-9" in page.content.decode(), field
    body = {"filename": "d.csv", "size": value, "sha256": "0" * 64}
    r = web.post("/uploads/", body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert not Job.objects.exists() and not Upload.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", FOREIGN_12)
def test_the_web_price_form_refuses_foreign_digits(make_agent, value: str) -> None:
    from django.test import Client

    from marketplace.nodes.models import Node

    agent = make_agent(price="0.40")
    node = Node.objects.get(pk=agent.node_id)
    web = Client()
    web.force_login(node.owner)
    web.post(f"/nodes/{node.pk}/price/", {f"n{node.pk}-price_per_gpu_hour": value})
    assert str(Node.objects.get(pk=node.pk).price_per_gpu_hour) == "0.4000"
    # an ASCII price is taken (the form's field name is right)
    web.post(f"/nodes/{node.pk}/price/", {f"n{node.pk}-price_per_gpu_hour": "0.5"})
    assert str(Node.objects.get(pk=node.pk).price_per_gpu_hour) == "0.5000"


@pytest.mark.django_db
def test_a_job_with_a_max_price_of_zero_is_refused(buyer) -> None:
    from django.test import Client

    from marketplace.accounts.models import User
    from marketplace.jobs.errors import MarketplaceError
    from marketplace.jobs.models import Job
    from marketplace.jobs.submission import submit_job
    from tests.marketplace.helpers import SMALL_SPEC

    for price in ("0", "0.0000", "-1"):
        body = {"spec": SMALL_SPEC, "max_price_per_gpu_hour": price, "budget": "1"}
        r = buyer.post("/api/v1/jobs/", body, format="json")
        assert r.status_code == 400 and "max_price_per_gpu_hour" in r.json()["fields"], price
    # nor through the spec's own cap, nor the service itself
    capped = SMALL_SPEC | {"requirements": {"max_price_per_hour": 0}}
    body = {"spec": capped, "max_price_per_gpu_hour": "1", "budget": "1"}
    r = buyer.post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400 and "requirements.max_price_per_hour" in r.content.decode()
    user = User.objects.get(role="buyer")
    with pytest.raises(MarketplaceError, match="more than 0"):
        submit_job(buyer=user, spec_data=SMALL_SPEC, budget=Decimal(1),
                   max_price_per_gpu_hour=Decimal(0))  # fmt: skip
    web = Client()
    web.force_login(user)
    form = {"spec": "name: x", "tier": "hybrid", "budget": "1", "max_price_per_gpu_hour": "0"}
    assert web.post("/jobs/new/", form).status_code == 400
    assert not Job.objects.exists()
