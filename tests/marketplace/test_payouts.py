"""Providers' earnings and payouts over the API: minimum, idempotency, audit trail."""

from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace.ledger import accounts
from marketplace.ledger.models import Payout, Transaction
from marketplace.ledger.posting import balance, post
from marketplace.ledger.reconcile import reconcile
from tests.marketplace.helpers import client_for

pytestmark = pytest.mark.django_db

WALLET = "0x" + "ab" * 20


@pytest.fixture
def earner(make_user):
    """A provider with 20 credits of earnings (as charges would have left them)."""
    user, key = make_user("provider")
    buyer, _ = make_user("buyer")
    legs = [
        (accounts.buyer_credit(buyer), Decimal("-20")),
        (accounts.provider_earnings(user), Decimal("20")),
    ]
    post("seed-earnings", "grant", legs)
    return user, client_for(key)


def request(client, amount="6", key="k1", wallet=WALLET):
    body = {"amount": amount, "wallet_address": wallet}
    return client.post("/api/v1/payouts/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_retried_payout_request_pays_once(earner) -> None:
    user, client = earner
    first = request(client)
    assert first.status_code == 201 and first.json()["status"] == "requested"
    again = request(client)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Payout.objects.filter(user=user).count() == 1
    assert balance(accounts.provider_earnings(user)) == Decimal("14")
    assert client.get("/api/v1/ledger/balance").json()["pending_payouts"] == "6.000000"
    assert reconcile(with_chain=False).ok


def test_a_reused_key_for_another_payout_is_a_conflict(earner) -> None:
    _, client = earner
    request(client)
    response = request(client, amount="7")
    assert response.status_code == 409 and response.json()["error"] == "idempotency_conflict"


@pytest.mark.parametrize(
    ("amount", "wallet", "key", "words"),
    [
        ("4.99", WALLET, "a", "minimum payout is 5"),
        ("21", WALLET, "b", "20.000000 of earnings available"),
        ("6", "0x123", "c", "not a wallet address"),
        ("6.0000001", WALLET, "d", "decimal places"),
        ("-6", WALLET, "e", "positive"),
        ("6", WALLET, "", "idempotency key"),
    ],
)
def test_bad_payout_requests_say_what_is_wrong(earner, amount, wallet, key, words) -> None:
    user, client = earner
    response = request(client, amount=amount, wallet=wallet, key=key)
    assert response.status_code == 400, response.content
    assert words in response.json()["detail"]
    assert balance(accounts.provider_earnings(user)) == Decimal("20")
    assert not Payout.objects.exists()


def test_floats_are_refused_for_money(earner) -> None:
    _, client = earner
    body = {"amount": 6.5, "wallet_address": WALLET, "idempotency_key": "f"}
    response = client.post("/api/v1/payouts/", body, format="json")
    assert response.status_code == 400 and "decimal string" in response.json()["detail"]


def test_operator_marks_a_payout_paid_once_with_an_audit_trail(earner, make_user) -> None:
    _, client = earner
    payout_id = request(client).json()["id"]
    _, op_key = make_user("operator")
    operator = client_for(op_key)
    for _ in range(2):
        response = operator.post(
            f"/api/v1/operator/payouts/{payout_id}/paid", {"reference": "wire 42"}, format="json"
        )
        assert response.status_code == 200 and response.json()["status"] == "paid"
    assert balance(accounts.external_payouts()) == Decimal("6")  # it left the platform
    tx = Transaction.objects.get(key=f"payout-paid:{payout_id}")
    assert tx.actor.role == "operator" and "wire 42" in tx.memo
    assert client.get("/api/v1/payouts/").json()["results"][0]["reference"] == "wire 42"
    assert operator.get("/api/v1/operator/reconcile").json()["ok"] is True


def test_only_operators_grant_credit_and_a_grant_is_idempotent(make_user) -> None:
    buyer, buyer_key = make_user("buyer")
    _, op_key = make_user("operator")
    body = {"username": buyer.username, "amount": "12.50", "idempotency_key": "g1"}
    assert client_for(buyer_key).post("/api/v1/operator/credits", body).status_code == 403
    for _ in range(2):
        response = client_for(op_key).post("/api/v1/operator/credits", body, format="json")
        assert response.status_code == 201
    assert response.json()["balance"]["available"] == "1012.500000"
    unknown = client_for(op_key).post(
        "/api/v1/operator/credits", body | {"username": "nobody"}, format="json"
    )
    assert unknown.status_code == 404 and "nobody" in unknown.json()["detail"]


def test_earnings_endpoint_lists_by_node_job_and_day(earner) -> None:
    _, client = earner
    data = client.get("/api/v1/ledger/earnings?days=7").json()
    assert data["balance"] == "20.000000" and len(data["daily"]) == 7
