"""Posting transactions: the only code that writes entries.

Every transaction balances to zero, is found again by its key when retried, and never takes
an account that must stay non-negative below zero. Debited accounts are row-locked
(SELECT ... FOR UPDATE) in a fixed order before their balance is read, so two concurrent
charges against one escrow cannot both see the same balance; PostgreSQL needs no more, and
SQLite serialises writers anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction

from marketplace.events.services import job_changed, money_changed
from marketplace.ledger.errors import IdempotencyConflict, InsufficientFunds, Unbalanced
from marketplace.ledger.models import Account, Entry, Transaction
from marketplace.ledger.money import ZERO, q
from marketplace.ledger.sums import exact_sum


def balance(account: Account) -> Decimal:
    return q(exact_sum(Entry.objects.filter(account=account)))


def post(
    key: str,
    kind: str,
    legs: Sequence[tuple[Account, Decimal]],
    *,
    memo: str = "",
    **about: Any,
) -> Transaction:
    """Post `legs` (account, signed amount) as one transaction, or return the one already
    posted under `key` (after checking it is the same movement)."""
    legs = [(a, q(amount)) for a, amount in legs if q(amount) != 0]
    total = sum((amount for _, amount in legs), ZERO)
    if total != 0:
        raise Unbalanced(f"Transaction {key} does not balance: its entries sum to {total}.")
    if not legs:
        raise Unbalanced(f"Transaction {key} moves no money.")
    with transaction.atomic():
        existing = Transaction.objects.filter(key=key).first()
        if existing is not None:
            _same(existing, legs)
            return existing
        debited = sorted({a.pk for a, amount in legs if amount < 0 and a.non_negative})
        locked = {
            a.pk: a for a in Account.objects.select_for_update(no_key=True).filter(pk__in=debited)
        }
        for pk in debited:
            needed = -sum((amt for a, amt in legs if a.pk == pk), ZERO)
            have = balance(locked[pk])
            if needed > have:
                raise InsufficientFunds(
                    f"Account {locked[pk].code} holds {have}; {needed} is needed ({kind}, {key}).",
                    account=locked[pk].code,
                    balance=str(have),
                    needed=str(needed),
                )
        try:
            with transaction.atomic():
                tx = Transaction.objects.create(key=key, kind=kind, memo=memo, **about)
        except IntegrityError:
            # a concurrent poster won the key (or the task result's one charge)
            existing = Transaction.objects.filter(key=key).first()
            if existing is None:
                raise
            _same(existing, legs)
            return existing
        Entry.objects.bulk_create(Entry(transaction=tx, account=a, amount=amt) for a, amt in legs)
        # balances on live pages: the users' and jobs' whose accounts moved
        money_changed(*{a.user_id for a, _ in legs if a.user_id is not None})
        job_changed(*{a.job_id for a, _ in legs if a.job_id is not None})
    return tx


def _same(tx: Transaction, legs: Sequence[tuple[Account, Decimal]]) -> None:
    had = sorted((e.account_id, e.amount) for e in tx.entries.all())
    want = sorted((a.pk, amount) for a, amount in legs)
    if had != want:
        raise IdempotencyConflict(
            f"Key {tx.key} was already used for a different movement of money."
        )
