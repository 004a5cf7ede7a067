"""Reads of the ledger for the API, the web pages and the demo summary."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.jobs.models import Job
from marketplace.ledger import accounts, holds
from marketplace.ledger.models import Entry, Payout, PayoutStatus, Transaction, TxKind
from marketplace.ledger.money import ZERO, q
from marketplace.ledger.posting import balance
from marketplace.ledger.sums import exact_sum
from marketplace.nodes.models import Node


@dataclass(frozen=True)
class JobCosts:
    budget: Decimal
    held: Decimal  # still in escrow
    spent: Decimal  # charged for verified work, fees and bonuses included
    provider_share: Decimal
    platform_fee: Decimal
    bonus: Decimal
    redundancy_cost: Decimal  # charges for replicas beyond the first, paid to verify
    refunded: Decimal
    forfeited: Decimal  # given back: charges of work whose node then failed verification
    shortfall: Decimal  # verified work the escrow could not cover (should stay zero)
    charges: int

    def to_dict(self) -> dict[str, str | int]:
        return {k: (v if isinstance(v, int) else str(v)) for k, v in self.__dict__.items()}


def job_costs(job: Job) -> JobCosts:
    spent = share = fee = bonus = redundancy = shortfall = ZERO
    charges = 0
    for tx in Transaction.objects.filter(job=job, kind=TxKind.CHARGE).only("details"):
        d = tx.details
        gross = Decimal(d["gross"])
        spent += gross
        share += Decimal(d["net"])
        fee += Decimal(d["fee"])
        bonus += min(Decimal(d["bonus"]), gross)
        shortfall += Decimal(d.get("shortfall", "0"))
        if d.get("replica", 0) > 0:
            redundancy += gross
        charges += 1
    refunded = Entry.objects.filter(
        transaction__job=job, transaction__kind=TxKind.RELEASE, amount__gt=0
    ).aggregate(s=Sum("amount"))["s"]
    return JobCosts(
        budget=q(job.budget),
        held=balance(accounts.job_escrow(job)),
        spent=q(spent),
        provider_share=q(share),
        platform_fee=q(fee),
        bonus=q(bonus),
        redundancy_cost=q(redundancy),
        refunded=q(refunded or ZERO),
        forfeited=holds.forfeited_refunds(job.pk),
        shortfall=q(shortfall),
        charges=charges,
    )


@dataclass(frozen=True)
class Balances:
    available: Decimal  # buyer credit not held by a job
    held: Decimal  # in the escrow of the user's jobs
    earnings: Decimal  # provider earnings not yet requested, held or not
    earnings_held: Decimal  # of which on payout hold (unverified work, ledger/holds.py)
    earnings_available: Decimal  # of which withdrawable now
    pending_payouts: Decimal
    paid_out: Decimal

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}


def balances(user: User) -> Balances:
    held = exact_sum(Entry.objects.filter(account__job__buyer=user))
    pending = exact_sum(Payout.objects.filter(user=user, status=PayoutStatus.REQUESTED))
    paid = exact_sum(
        Payout.objects.filter(user=user, status__in=[PayoutStatus.PAID, PayoutStatus.BATCHED])
    )
    earnings = balance(accounts.provider_earnings(user))
    on_hold = min(holds.held(user), earnings)
    return Balances(
        available=balance(accounts.buyer_credit(user)),
        held=q(held or ZERO),
        earnings=earnings,
        earnings_held=on_hold,
        earnings_available=earnings - on_hold,
        pending_payouts=q(pending or ZERO),
        paid_out=q(paid or ZERO),
    )


def _earning_entries(user: User) -> QuerySet[Entry]:
    return Entry.objects.filter(
        account__code=f"earnings:{user.pk}", transaction__kind=TxKind.CHARGE
    )


def earnings_series(user: User, days: int = 30) -> list[tuple[dt.date, Decimal]]:
    """Earnings per day over the last `days` days, zero-filled, oldest first."""
    today = timezone.localdate()
    start = today - dt.timedelta(days=days - 1)
    rows = (
        _earning_entries(user)
        .filter(transaction__created_at__date__gte=start)
        .annotate(day=TruncDate("transaction__created_at"))
        .values("day")
        .annotate(s=Sum("amount"))
    )
    by_day = {r["day"]: q(r["s"]) for r in rows}
    return [
        (start + dt.timedelta(days=i), by_day.get(start + dt.timedelta(days=i), ZERO))
        for i in range(days)
    ]


def _earnings_by(user: User, what: str) -> list[dict[str, object]]:
    """The user's earnings grouped by the charges' node or job, largest first."""
    rows = (
        _earning_entries(user)
        .values(f"transaction__{what}_id", f"transaction__{what}__name")
        .annotate(amount=Sum("amount"), tasks=Count("id"))
        .order_by("-amount")
    )
    return [
        {
            f"{what}_id": r[f"transaction__{what}_id"],
            f"{what}_name": r[f"transaction__{what}__name"],
            "amount": q(r["amount"]),
            "tasks": r["tasks"],
        }
        for r in rows
    ]


def earnings_by_node(user: User) -> list[dict[str, object]]:
    return _earnings_by(user, "node")


def earnings_by_job(user: User) -> list[dict[str, object]]:
    """As earnings_by_node; the job id as a string (a UUID)."""
    return [r | {"job_id": str(r["job_id"])} for r in _earnings_by(user, "job")]


def node_earnings(node: Node) -> dict[str, str]:
    """The node owner's share of charges for this node's work, today and in total (earnings
    later forfeited included); of it, what is `held` (waiting out its payout hold) and what
    was `forfeited` (taken back to the buyers when one of its results failed verification)."""
    mine = Entry.objects.filter(account__code=f"earnings:{node.owner_id}", transaction__node=node)
    entries = mine.filter(transaction__kind=TxKind.CHARGE)
    total = entries.aggregate(s=Sum("amount"))["s"]
    today = entries.filter(transaction__created_at__date=timezone.localdate()).aggregate(
        s=Sum("amount")
    )["s"]
    forfeited = -exact_sum(mine.filter(transaction__kind=TxKind.FORFEIT))
    return {
        "today": str(q(today or ZERO)),
        "total": str(q(total or ZERO)),
        "held": str(holds.held_for_node(node.pk)),
        "forfeited": str(q(forfeited)),
    }


def payouts_for(user: User) -> QuerySet[Payout]:
    return Payout.objects.filter(user=user).order_by("-created_at")


def statement(user: User, limit: int = 100) -> QuerySet[Entry]:
    """The user's own entries, newest first: what moved, when and why."""
    return (
        Entry.objects.filter(account__user=user)
        .select_related("transaction", "account")
        .order_by("-transaction__created_at", "-pk")[:limit]
    )
