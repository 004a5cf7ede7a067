"""Payout holds: a volunteer's earnings for work no replica checked wait PAYOUT_HOLD_S before
they can be paid out, and are forfeited to the buyers who paid for them if one of the node's
results fails verification first (docs/money.md, "Cheating does not pay").

A hold is a row beside the charge, not an entry: the provider's earnings account keeps the
money, and what it may withdraw is its balance less its running holds. A hold runs while
`until` is ahead and its result is not verified; both are read when asked, so a hold ends by
itself (no periodic task can be missed) and a replica that agrees later (a spot check after
the upload) releases it at once. Forfeiture is a ledger transaction: the held net back from
the provider's earnings and the charge's fee back from the platform's fees, both to the
buyers' credit, so the ledger stays balanced and `reconcile` sees it.

Not held: platform nodes' earnings (the operator's own machines, enrolled with a token) and
verified results (a replica agreed: the work is checked).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from marketplace.accounts.models import User
from marketplace.ledger import accounts
from marketplace.ledger.models import Account, EarningsHold, HoldState, Transaction, TxKind
from marketplace.ledger.money import ZERO, q
from marketplace.ledger.posting import balance, post
from marketplace.ledger.sums import exact_sum
from marketplace.nodes.models import NodeKind
from marketplace.rounds.models import TaskResult


def now() -> datetime:
    """The holds' clock (the tests move it instead of sleeping)."""
    return timezone.now()


def hold_seconds() -> float:
    return float(settings.GPUFLEX["PAYOUT_HOLD_S"])


def hold_charge(charge: Transaction, result: TaskResult) -> EarningsHold | None:
    """Hold a just-posted charge's net when its work is a volunteer's and unverified; once
    per charge (a re-delivered settlement finds the first hold). Call in the charge's
    database transaction, so a charge never exists without its hold."""
    node = result.node
    if node.kind == NodeKind.PLATFORM or result.verified is True or hold_seconds() <= 0:
        return None
    job = charge.job
    hold, _ = EarningsHold.objects.get_or_create(
        charge=charge,
        defaults={
            "node": node,
            "user_id": node.owner_id,
            "job": job,
            "buyer_id": job.buyer_id,
            "amount": Decimal(charge.details["net"]),
            "fee": Decimal(charge.details["fee"]),
            "until": now() + timedelta(seconds=hold_seconds()),
        },
    )
    return hold


def running(holds: QuerySet[EarningsHold], at: datetime | None = None) -> QuerySet[EarningsHold]:
    """The holds that still keep their money from payout at `at` (now by default)."""
    return holds.filter(state=HoldState.HELD, until__gt=at or now()).exclude(
        charge__task_result__verified=True
    )


def held(user: User | int, at: datetime | None = None) -> Decimal:
    """A provider's earnings not yet withdrawable."""
    uid = user if isinstance(user, int) else user.pk
    return q(exact_sum(running(EarningsHold.objects.filter(user_id=uid), at)))


def held_for_node(node_id: int, at: datetime | None = None) -> Decimal:
    return q(exact_sum(running(EarningsHold.objects.filter(node_id=node_id), at)))


def releases(user: User | int, at: datetime | None = None) -> list[tuple[datetime, Decimal]]:
    """(when, amount) of each running hold, soonest first: when held money becomes free."""
    uid = user if isinstance(user, int) else user.pk
    rows = running(EarningsHold.objects.filter(user_id=uid), at).order_by("until", "pk")
    return [(until, q(amount)) for until, amount in rows.values_list("until", "amount")]


def releases_by_day(user: User | int, at: datetime | None = None) -> list[tuple[str, Decimal]]:
    """(UTC date, amount) the running holds release each day, soonest first."""
    days: dict[str, Decimal] = {}
    for until, amount in releases(user, at):
        day = until.astimezone(UTC).date().isoformat()
        days[day] = days.get(day, ZERO) + amount
    return list(days.items())


def available(user: User | int, at: datetime | None = None) -> Decimal:
    """Earnings the provider may request as a payout now: its balance less running holds."""
    return max(balance(accounts.provider_earnings(user)) - held(user, at), ZERO)


def free_at(user: User | int, amount: Decimal, at: datetime | None = None) -> datetime | None:
    """When `amount` becomes withdrawable as holds end (no forfeiture, no new payouts);
    None if the balance never covers it."""
    at = at or now()
    free = available(user, at)
    if amount <= free:
        return at
    for until, released in releases(user, at):
        free += released
        if amount <= free:
            return until
    return None


def refusal(user: User, amount: Decimal, at: datetime | None = None) -> str:
    """Why a payout of `amount` is more than is withdrawable, naming the hold and its end."""
    at = at or now()
    free, on_hold = available(user, at), held(user, at)
    days = hold_seconds() / 86400
    sentence = f"You have {free} of earnings available; {amount} was requested."
    if on_hold <= 0:
        return sentence
    when = free_at(user, amount, at)
    plan = (
        f"enough of it is released at {when:%Y-%m-%d %H:%M} UTC"
        if when is not None
        else f"the last of it is released at {releases(user, at)[-1][0]:%Y-%m-%d %H:%M} UTC"
    )
    return (
        f"{sentence} {on_hold} more is on hold, and {plan}: earnings of work no replica "
        f"has checked are held for {days:g} days (GPUFLEX_PAYOUT_HOLD_S) and forfeited to "
        "the buyers if one of the node's results fails verification first."
    )


def forfeit_held(node_id: int, reason: str) -> Decimal:
    """A result of the node failed verification: every running hold of its earnings is
    forfeited, and the buyers whose jobs paid them are refunded what those charges cost
    them (the net from the provider's earnings, the fee from the platform's fees), in one
    balanced transaction. Returns the earnings the node lost (0 when nothing was held).
    Idempotent in effect: a forfeited hold is never counted again."""
    at = now()
    with transaction.atomic():
        holds = list(
            running(EarningsHold.objects.filter(node_id=node_id), at)
            .select_for_update(of=("self",))
            .order_by("pk")
        )
        if not holds:
            return ZERO
        earnings = accounts.provider_earnings(holds[0].user_id)
        fees = accounts.platform_fees()
        # locked before their balances are read, as posting locks what it debits
        list(
            Account.objects.select_for_update(no_key=True)
            .filter(pk__in=[earnings.pk, fees.pk])
            .order_by("pk")
        )
        # never more than the accounts hold: a forfeiture must not fail the verification
        # that triggered it (payouts only ever take what no hold keeps, so this is exact)
        nets = _capped([h.amount for h in holds], balance(earnings))
        fee_backs = _capped([h.fee for h in holds], balance(fees))
        refunds: dict[int, Decimal] = defaultdict(lambda: ZERO)
        by_job: dict[str, Decimal] = defaultdict(lambda: ZERO)
        for hold, net, fee in zip(holds, nets, fee_backs, strict=True):
            refunds[hold.buyer_id] += net + fee
            by_job[str(hold.job_id)] += net + fee
        lost, fee_back = sum(nets, ZERO), sum(fee_backs, ZERO)
        if lost + fee_back == 0:
            EarningsHold.objects.filter(pk__in=[h.pk for h in holds]).update(
                state=HoldState.FORFEITED
            )
            return ZERO
        legs = [(earnings, -lost), (fees, -fee_back)]
        legs += [(accounts.buyer_credit(b), amount) for b, amount in sorted(refunds.items())]
        tx = post(
            f"forfeit:{node_id}:{holds[0].pk}",  # a hold is forfeited once: its pk is unique
            TxKind.FORFEIT,
            legs,
            memo=f"held earnings of node {node_id} forfeited: {reason}"[:300],
            node_id=node_id,
            details={
                "reason": reason[:300],
                "holds": len(holds),
                "net": str(lost),
                "fee": str(fee_back),
                "not_refunded": str(sum((h.amount + h.fee for h in holds), ZERO) - lost - fee_back),
                "jobs": {job: str(amount) for job, amount in by_job.items()},
            },
        )
        EarningsHold.objects.filter(pk__in=[h.pk for h in holds]).update(
            state=HoldState.FORFEITED, forfeit=tx
        )
    return lost


def _capped(amounts: Iterable[Decimal], most: Decimal) -> list[Decimal]:
    """`amounts` in order, as far as `most` covers them."""
    out = []
    left = max(most, ZERO)
    for amount in amounts:
        take = min(amount, left)
        out.append(take)
        left -= take
    return out


def forfeited_refunds(job_id: object) -> Decimal:
    """What forfeitures gave back to a job's buyer for work on that job."""
    total = ZERO
    for details in (
        Transaction.objects.filter(kind=TxKind.FORFEIT, forfeited__job_id=job_id)
        .distinct()
        .values_list("details", flat=True)
    ):
        total += Decimal(details.get("jobs", {}).get(str(job_id), "0"))
    return q(total)
