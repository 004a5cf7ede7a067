"""Posting: balanced, idempotent, never below zero; grants and holds."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection

from marketplace.accounts.services import create_user
from marketplace.ledger import accounts
from marketplace.ledger.errors import (
    IdempotencyConflict,
    InsufficientFunds,
    LedgerError,
    Unbalanced,
)
from marketplace.ledger.models import Entry, Transaction
from marketplace.ledger.posting import balance, post
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.services import grant_credit

pytestmark = pytest.mark.django_db


def test_a_transaction_must_balance_and_leaves_nothing_when_it_does_not() -> None:
    user = create_user("u1", "buyer")
    with pytest.raises(Unbalanced, match=r"sum to 1\.000000"):
        post("bad", "grant", [(accounts.external_grants(), Decimal("-1")),
                              (accounts.buyer_credit(user), Decimal("2"))])  # fmt: skip
    assert not Transaction.objects.filter(key="bad").exists()


def test_a_retried_key_posts_once_and_a_reused_key_is_refused() -> None:
    user = create_user("u2", "buyer")
    for _ in range(3):
        grant_credit(user=user, amount="5", memo="m", operator=None, key="grant:once")
    assert balance(accounts.buyer_credit(user)) == Decimal("5")
    with pytest.raises(IdempotencyConflict):
        grant_credit(user=user, amount="6", memo="m", operator=None, key="grant:once")


def test_user_accounts_never_go_below_zero() -> None:
    user = create_user("u3", "buyer")
    grant_credit(user=user, amount="1", memo="m", operator=None)
    with pytest.raises(InsufficientFunds, match=r"holds 1.000000; 2.000000 is needed"):
        post("take", "hold", [(accounts.buyer_credit(user), Decimal("-2")),
                              (accounts.platform_fees(), Decimal("2"))])  # fmt: skip
    assert balance(accounts.buyer_credit(user)) == 1
    assert reconcile(with_chain=False).ok


@pytest.mark.parametrize("amount", ["0", "-1", "1.0000001", "abc", 1.5, "NaN"])
def test_bad_amounts_are_named(amount) -> None:
    user = create_user(f"u4{abs(hash(str(amount)))}", "buyer")
    with pytest.raises(LedgerError, match="Invalid amount"):
        grant_credit(user=user, amount=amount, memo="m", operator=None)
    assert not Entry.objects.filter(account__user=user).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_concurrent_debits_of_one_account_cannot_overdraw_it() -> None:
    """Ten threads each try to spend 3 of 10 credits: exactly three succeed."""
    user = create_user("racer", "buyer")
    grant_credit(user=user, amount="10", memo="m", operator=None)
    barrier, outcomes = threading.Barrier(10), []

    def spend(i: int) -> None:
        barrier.wait()
        try:
            post(f"spend:{i}", "hold", [(accounts.buyer_credit(user), Decimal("-3")),
                                        (accounts.platform_fees(), Decimal("3"))])  # fmt: skip
            outcomes.append("ok")
        except InsufficientFunds:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 3 and outcomes.count("refused") == 7
    assert balance(accounts.buyer_credit(user)) == Decimal("1")
