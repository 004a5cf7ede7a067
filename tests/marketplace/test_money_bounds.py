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

    for field in ("budget", "max_price_per_gpu_hour"):
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
