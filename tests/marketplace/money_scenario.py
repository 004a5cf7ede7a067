"""Hostile money amounts against the API, run on PostgreSQL by test_money_bounds.py and on
SQLite by sqlite_money.py in a fresh process: every refusal is a 400 naming its field with
nothing stored, the largest amount allowed round-trips exactly, and every page still reads."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from marketplace.accounts.services import create_user, issue_user_key
from marketplace.ledger import accounts
from marketplace.ledger.models import Entry, Payout, Transaction
from marketplace.ledger.money import MAX_AMOUNT
from marketplace.ledger.posting import post

WALLET = "0x" + "cd" * 20
# the report's amounts and their siblings: overflows, rounding, non-numbers
HOSTILE = [
    "1e15",
    "99999999999999.999999",
    "1000000000",
    "1e30",
    "1E+999999",
    "0.0000001",
    "1.0000005",
    "NaN",
    "Infinity",
    "-inf",
    "1_000",
    "",
]


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def _stored() -> tuple[int, int, int]:
    return Transaction.objects.count(), Entry.objects.count(), Payout.objects.count()


def run(suffix: str = "") -> dict[str, Any]:
    operator = create_user(f"ops{suffix}", "operator")
    buyer = create_user(f"buyer{suffix}", "buyer")
    provider = create_user(f"prov{suffix}", "provider")
    ops, buyer_api = _client(issue_user_key(operator)[1]), _client(issue_user_key(buyer)[1])
    prov_api = _client(issue_user_key(provider)[1])
    legs = [(accounts.external_grants(), Decimal(-50)), (accounts.provider_earnings(provider), 50)]
    post(f"seed{suffix}", "grant", legs)
    out: dict[str, Any] = {"grants": {}, "payouts": {}, "cli": {}}
    before = _stored()
    for amount in HOSTILE:
        body = {"username": buyer.username, "amount": amount}
        r = ops.post("/api/v1/operator/credits", body, format="json")
        out["grants"][amount] = [r.status_code, sorted(r.json().get("fields", {}))]
        body = {"amount": amount, "wallet_address": WALLET, "idempotency_key": f"p{amount}"}
        r = prov_api.post("/api/v1/payouts/", body, format="json")
        out["payouts"][amount] = [r.status_code, sorted(r.json().get("fields", {}))]
        try:
            call_command("grant_credit", buyer.username, amount or "0", verbosity=0)
            out["cli"][amount] = "granted"
        except CommandError as exc:
            out["cli"][amount] = str(exc)
    out["stored_unchanged"] = _stored() == before
    body = {"username": buyer.username, "amount": str(MAX_AMOUNT)}
    out["max_grant"] = ops.post("/api/v1/operator/credits", body, format="json").status_code
    out["balance"] = buyer_api.get("/api/v1/ledger/balance").json()
    out["statement"] = buyer_api.get("/api/v1/ledger/statement").status_code
    out["reconcile"] = ops.get("/api/v1/operator/reconcile").json()
    out["max_amount"] = str(MAX_AMOUNT)
    return out
