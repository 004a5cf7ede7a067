"""`gpuflex manage reconcile`: passes on a sound ledger, names every broken invariant."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from marketplace.accounts.services import create_user
from marketplace.ledger import accounts
from marketplace.ledger.models import Entry, Transaction
from marketplace.ledger.services import grant_credit

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("reconcile", *args, stdout=out)
    return out.getvalue()


def test_a_sound_ledger_reconciles() -> None:
    grant_credit(user=create_user("b", "buyer"), amount="3", memo="m", operator=None)
    out = run()
    assert "the ledger reconciles" in out and out.count("checked:") == 6
    assert json.loads(run("--json"))["ok"] is True


def test_tampering_is_found_and_fails_the_command() -> None:
    user = create_user("b2", "buyer")
    tx = grant_credit(user=user, amount="3", memo="m", operator=None)
    # someone edits an amount in the database behind the ledger's back
    Entry.objects.filter(transaction=tx, amount__gt=0).update(amount=Decimal("4"))
    overdraw = Transaction.objects.create(key="manual", kind="hold")
    Entry.objects.create(transaction=overdraw, account=accounts.platform_fees(), amount=-1)
    Entry.objects.create(transaction=overdraw, account=accounts.buyer_credit(user), amount=1)
    with pytest.raises(CommandError, match="problem"):
        run()
    report = json.loads(_json_ignoring_exit())
    problems = " ".join(report["problems"])
    assert "sum to 1.000000, not 0" in problems
    assert f"Transaction {tx.key} sums to 1" in problems
    assert "platform:fees is at -1.000000, below zero" in problems


def _json_ignoring_exit() -> str:
    from io import StringIO

    out = StringIO()
    with pytest.raises(CommandError):
        call_command("reconcile", "--json", stdout=out)
    return out.getvalue()


def test_escrow_held_behind_a_stuck_aggregation_is_reported(submit, buyer) -> None:
    """#20: a job whose aggregation failed on every retry, then cancelled by its buyer,
    kept its budget in escrow while reconcile said ok (an aggregating round was taken to be
    still paying). A round just closed still is; one restarted or past STUCK_AGGREGATION_S
    is stuck, and the escrow it holds is reported."""
    from django.utils import timezone

    from marketplace.rounds.models import Round

    job = submit(tier="volunteer")
    rnd = Round.objects.get(job_id=job["id"])
    Round.objects.filter(pk=rnd.pk).update(status="aggregating", aggregating_since=timezone.now())
    assert buyer.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    assert "the ledger reconciles" in run()  # its last aggregation still pays, then refunds

    Round.objects.filter(pk=rnd.pk).update(aggregation_restarts=3)
    report = json.loads(_json_ignoring_exit())
    problems = " ".join(report["problems"])
    assert f"Job {job['id']} is cancelled but still holds 10.000000 in escrow" in problems
    assert "behind a stuck aggregation: round 1" in problems and "restarted 3 times" in problems
