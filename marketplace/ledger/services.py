"""Every movement of money the marketplace makes, each one idempotent by its key.

Callers hold the relevant rows locked in their own transaction (the job when holding or
releasing, the round when charging); posting.post locks the accounts it debits.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from marketplace.accounts.models import User
from marketplace.jobs.models import ACTIVE_STATUSES, Job
from marketplace.ledger import accounts, holds, reservations
from marketplace.ledger.errors import (
    IdempotencyConflict,
    InsufficientCredit,
    InsufficientFunds,
    InvalidPayout,
    LedgerError,
)
from marketplace.ledger.metering import Rules, cap, meter, per_sample, seconds_per_sample
from marketplace.ledger.models import (
    Account,
    Payout,
    PayoutKind,
    PayoutStatus,
    ReservationState,
    Transaction,
    TxKind,
    WalletAddress,
)
from marketplace.ledger.money import ZERO, parse_amount, q
from marketplace.ledger.observed_speed import job_parameters, observe_speed
from marketplace.ledger.posting import balance, post
from marketplace.ledger.reservations import free_escrow
from marketplace.nodes.models import Node
from marketplace.rounds.models import TaskResult

ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")


# -- buyers -----------------------------------------------------------------------------------


def grant_credit(
    *, user: User, amount: Decimal | str, memo: str, operator: User | None, key: str = ""
) -> Transaction:
    """An operator adds credit to a buyer (a purchase paid elsewhere, a promotion)."""
    amount = _amount(amount)
    return post(
        key or f"grant:{uuid.uuid4()}",
        TxKind.GRANT,
        [(accounts.external_grants(), -amount), (accounts.buyer_credit(user), amount)],
        memo=memo[:300],
        actor=operator,
    )


def check_credit(buyer: User, budget: Decimal) -> None:
    """Fail early, before a submission does any heavy work."""
    if budget <= 0:
        raise LedgerError(f"A job needs a positive budget; got {budget}.", field="budget")
    have = balance(accounts.buyer_credit(buyer))
    if have < budget:
        raise InsufficientCredit(
            f"The budget {budget} is more than your available credit {have}.",
            available=str(have),
            budget=str(budget),
        )


def hold_budget(job: Job) -> Transaction:
    """Move the job's budget from its buyer's credit into the job's escrow."""
    try:
        return post(
            f"hold:{job.pk}",
            TxKind.HOLD,
            [
                (accounts.buyer_credit(job.buyer_id), -job.budget),
                (accounts.job_escrow(job), job.budget),
            ],
            memo=f"budget of job {job.name}",
            job=job,
        )
    except InsufficientFunds as exc:
        raise InsufficientCredit(
            f"The budget {job.budget} is more than your available credit {exc.extra['balance']}.",
            available=exc.extra["balance"],
            budget=str(job.budget),
        ) from None


def fund_child(parent: Job, child: Job) -> Transaction:
    """A sweep's trial is funded from the sweep's escrow (marketplace/sweeps), with the
    child's `budget`; the caller holds the sweep's lock."""
    return post(
        f"fund:{child.pk}",
        TxKind.HOLD,
        [(accounts.job_escrow(parent), -child.budget), (accounts.job_escrow(child), child.budget)],
        memo=f"budget of trial {child.name} from sweep {parent.name}",
        job=child,
    )


def release_escrow(job: Job) -> Transaction | None:
    """Unspent escrow back to the buyer, once, when a job ends for any reason; its open
    reservations go with it (the job charges nothing more). A sweep's trial returns it to
    its sweep while the sweep runs: its later trials may spend it (what a pruned trial did
    not use, for one)."""
    reservations.release_job(job.pk)
    escrow = accounts.job_escrow(job)
    left = balance(escrow)
    if left <= 0:
        return None
    parent = (
        Job.objects.filter(pk=job.parent_id, status__in=ACTIVE_STATUSES).first()
        if job.parent_id
        else None
    )
    to = accounts.job_escrow(parent) if parent else accounts.buyer_credit(job.buyer_id)
    return post(
        f"release:{job.pk}",
        TxKind.RELEASE,
        [(escrow, -left), (to, left)],
        memo=f"unspent budget of job {job.name} ({job.status})",
        job=job,
    )


# -- work -------------------------------------------------------------------------------------


def charge_result(result: TaskResult) -> Transaction | None:
    """Pay a credited result from its job's escrow: the provider's share and the platform fee.

    Only ever called for results that verification and aggregation credited; the database's
    one-charge-per-result constraint and the key make a re-delivered settlement a no-op."""
    if not result.credited:
        raise LedgerError(f"Result {result.pk} is not credited; only verified work is paid.")
    existing = Transaction.objects.filter(task_result=result).first()
    if existing is not None:
        return existing
    task = result.task
    job = task.round.job
    node = result.node
    rules = Rules.from_settings()
    observed = (result.created_at - task.leased_at).total_seconds() if task.leased_at else 0.0
    price = (
        task.price_per_gpu_hour if task.price_per_gpu_hour is not None else node.price_per_gpu_hour
    )
    reservation = reservations.open_reservation(task.pk)
    speed = observe_speed(result)  # the node's one figure, with this task folded in
    if job.kind == "inference":  # sold per sample processed (metering.per_sample)
        floor = float(settings.GPUFLEX["INFERENCE_MIN_S_PER_SAMPLE"])
        sps = seconds_per_sample(job_parameters(job), rules, floor)
        m = per_sample(samples=result.num_samples, seconds_per_sample=sps,
                       price_per_hour=Decimal(price), rules=rules)  # fmt: skip
    else:
        m = meter(
            reported_s=result.compute_s,
            observed_s=observed,
            fp32_tflops=speed.figure,
            price_per_hour=Decimal(price),
            cosine=result.cosine,
            rules=rules,
            # the bounds its lease reserved for: the charge is never more than the reservation
            max_seconds=reservation.seconds if reservation else None,
            max_speed=reservation.speed if reservation else None,
        )
    escrow = accounts.job_escrow(job)
    if reservation is not None and m.gross <= reservation.amount:
        shortfall = ZERO  # always: the reservation held it (and `post` checks the balance)
    else:  # a lease made before reservations existed: what no open reservation holds
        held = reservation.amount if reservation is not None else ZERO
        m, shortfall = cap(m, held + free_escrow([job.pk])[job.pk], rules)
    if m.gross <= 0:
        if reservation is not None:
            reservations.close(reservation, ReservationState.RELEASED)
        return None
    details = m.to_dict() | {
        "replica": task.replica,
        "round": task.round.number,
        "shortfall": str(shortfall),
        "reserved": str(reservation.amount) if reservation else None,
        "advertised_tflops": speed.advertised,
        "observed_tflops": speed.observed,
        "billed_tflops": speed.figure,
        "speed_flagged": speed.flagged,
    }
    with transaction.atomic():  # a volunteer's unverified earnings are never left unheld
        tx = post(
            f"charge:{result.pk}",
            TxKind.CHARGE,
            [
                (escrow, -m.gross),
                (accounts.provider_earnings(node.owner_id), m.net),
                (accounts.platform_fees(), m.fee),
            ],
            memo=f"round {task.round.number} of {job.name} on {node.name}",
            job=job,
            node=node,
            task_result=result,
            details=details,
        )
        holds.hold_charge(tx, result)
    if reservation is not None:
        reservations.close(reservation, ReservationState.CONVERTED)
    return tx


def release_unpaid(result: TaskResult) -> None:
    """A settled result that will never be paid (rejected) frees its lease's reservation."""
    if not result.accepted and not result.credited:
        reservations.release_tasks([result.task_id])


def round_costs(job: Job) -> list[Decimal]:
    """Gross charged per round so far, in round order."""
    totals: dict[int, Decimal] = {}
    for tx in Transaction.objects.filter(job=job, kind=TxKind.CHARGE):
        r = int(tx.details.get("round", 0))
        totals[r] = totals.get(r, ZERO) + Decimal(tx.details["gross"])
    return [totals[r] for r in sorted(totals)]


def budget_stop_reason(job: Job, candidates: Callable[[], QuerySet[Node]]) -> str:
    """Why the job cannot afford another round, or "" if it can. The exact rule first: its
    free escrow must cover one more lease (`reservations.unaffordable`); then the estimate:
    the escrow must cover the dearest round so far times a margin, so that a round is not
    started that would stall half done."""
    exact = reservations.unaffordable(job.pk, candidates)
    if exact:
        return (
            f"Stopped at the end of round {job.rounds_done}: {exact}. Raise the budget to "
            "train further."
        )
    costs = round_costs(job)
    if not costs:
        return ""
    left = balance(accounts.job_escrow(job))
    need = q(max(costs) * Decimal(str(settings.GPUFLEX["ROUND_BUDGET_MARGIN"])))
    if left >= need:
        return ""
    return (
        f"Stopped at the end of round {job.rounds_done}: the budget has {left} left and the "
        f"next round is estimated at {need} (the dearest round so far, {max(costs)}, times "
        f"{settings.GPUFLEX['ROUND_BUDGET_MARGIN']}). Raise the budget to train further."
    )


# -- providers --------------------------------------------------------------------------------


def request_payout(
    *,
    user: User,
    amount: Decimal | str,
    wallet_address: str,
    idempotency_key: str,
    kind: str = PayoutKind.EARNINGS,
) -> Payout:
    """Move money to payouts-pending from where `kind` keeps it (a provider's earnings, a
    buyer's credit, the platform's fees); a retry with the same key returns the first payout.
    A withdrawal goes to the buyer's registered wallet and covers only unspent on-chain
    deposits; fees and withdrawals leave only through the chain (pulled with a proof)."""
    if not idempotency_key or len(idempotency_key) > 100:
        raise InvalidPayout("A payout needs an idempotency key of 1 to 100 characters.")
    amount = _amount(amount)
    if not ADDRESS.match(wallet_address or ""):
        raise InvalidPayout(
            f"{wallet_address!r} is not a wallet address (0x followed by 40 hex digits)."
        )
    with transaction.atomic():
        existing = Payout.objects.filter(user=user, request_key=idempotency_key).first()
        if existing is not None:
            if (
                existing.amount != amount
                or existing.wallet_address != wallet_address
                or existing.kind != kind
            ):
                raise IdempotencyConflict(
                    f"Idempotency key {idempotency_key!r} was used for another payout "
                    f"({existing.kind}, {existing.amount} to {existing.wallet_address})."
                )
            return existing
        if kind == PayoutKind.EARNINGS:
            minimum = Decimal(str(settings.GPUFLEX["MIN_PAYOUT"]))
            if amount < minimum:
                raise InvalidPayout(f"The minimum payout is {minimum}; {amount} was requested.")
            # one provider's payouts at a time, and no forfeiture between the read and the
            # post: what running holds keep is not withdrawable (ledger/holds.py)
            earnings = accounts.provider_earnings(user)
            Account.objects.select_for_update(no_key=True).filter(pk=earnings.pk).get()
            free = holds.available(user)
            if amount > free:
                raise InvalidPayout(
                    holds.refusal(user, amount), available=str(free), held=str(holds.held(user))
                )
        elif not settings.CHAIN["URL"]:
            raise InvalidPayout(f"A {kind} payout goes through the chain, which is disabled.")
        if kind == PayoutKind.WITHDRAWAL:
            from marketplace.ledger.chain import withdrawable  # web3: only with the chain

            # one buyer's withdrawals at a time: the figure below must not be read twice
            Account.objects.select_for_update(no_key=True).filter(
                pk=accounts.buyer_credit(user).pk
            ).get()
            most = withdrawable(user)
            if amount > most:
                raise InvalidPayout(
                    f"You can withdraw {most} (unspent on-chain deposits); {amount} was requested."
                )
        payout = Payout.objects.create(
            user=user,
            amount=amount,
            wallet_address=wallet_address,
            request_key=idempotency_key,
            kind=kind,
        )
        try:
            post(
                f"payout:{payout.pk}",
                TxKind.PAYOUT_REQUEST,
                [(_payout_source(payout), -amount), (accounts.payouts_pending(), amount)],
                memo=f"{kind} payout to {wallet_address}",
                actor=user,
                details={"payout": payout.pk, "kind": kind},
            )
        except InsufficientFunds as exc:
            what = {"earnings": "earnings", "withdrawal": "credit", "fees": "platform fees"}
            raise InvalidPayout(
                f"You have {exc.extra['balance']} of {what[kind]} available; "
                f"{amount} was requested."
            ) from None
    return payout


def request_withdrawal(*, user: User, amount: Decimal | str, idempotency_key: str) -> Payout:
    """A buyer takes unspent on-chain deposits back to its registered wallet (pulled from the
    escrow with a proof once the next settlement batch is posted)."""
    wallet = WalletAddress.objects.filter(user=user).first()
    if wallet is None:
        raise InvalidPayout("Register the wallet you deposited from first (PUT ledger/wallet).")
    return request_payout(
        user=user,
        amount=amount,
        wallet_address=wallet.address,
        idempotency_key=idempotency_key,
        kind=PayoutKind.WITHDRAWAL,
    )


def request_fee_withdrawal(
    *, operator: User, amount: Decimal | str, wallet_address: str, idempotency_key: str
) -> Payout:
    """The operator takes platform fees to `wallet_address`, on chain, as the payouts are."""
    return request_payout(
        user=operator,
        amount=amount,
        wallet_address=wallet_address,
        idempotency_key=idempotency_key,
        kind=PayoutKind.FEES,
    )


def _payout_source(payout: Payout) -> Account:
    """Where a payout's money came from, and goes back to when it is reversed."""
    if payout.kind == PayoutKind.WITHDRAWAL:
        return accounts.buyer_credit(payout.user_id)
    if payout.kind == PayoutKind.FEES:
        return accounts.platform_fees()
    return accounts.provider_earnings(payout.user_id)


@transaction.atomic
def mark_payout_paid(payout: Payout, *, reference: str, operator: User | None) -> Payout:
    """An operator paid it off-chain (a bank or exchange transfer) under `reference`."""
    payout = Payout.objects.select_for_update(no_key=True).get(pk=payout.pk)
    if payout.status == PayoutStatus.PAID:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise LedgerError(f"Payout {payout.pk} is {payout.status}; only a requested one is paid.")
    if not reference.strip():
        raise LedgerError("Give the external payment's reference.")
    post(
        f"payout-paid:{payout.pk}",
        TxKind.PAYOUT_SETTLED,
        [
            (accounts.payouts_pending(), -payout.amount),
            (accounts.external_payouts(), payout.amount),
        ],
        memo=f"paid: {reference}"[:300],
        actor=operator,
        details={"payout": payout.pk},
    )
    payout.status, payout.reference = PayoutStatus.PAID, reference[:200]
    payout.save(update_fields=["status", "reference", "updated_at"])
    return payout


@transaction.atomic
def reverse_payout(payout: Payout, *, reason: str, operator: User | None) -> Payout:
    """A payout that cannot be made goes back to the provider's earnings."""
    payout = Payout.objects.select_for_update(no_key=True).get(pk=payout.pk)
    if payout.status == PayoutStatus.REVERSED:
        return payout
    if payout.status != PayoutStatus.REQUESTED:
        raise LedgerError(f"Payout {payout.pk} is {payout.status}; it can no longer be reversed.")
    post(
        f"payout-reversed:{payout.pk}",
        TxKind.PAYOUT_REVERSED,
        [
            (accounts.payouts_pending(), -payout.amount),
            (_payout_source(payout), payout.amount),
        ],
        memo=f"reversed: {reason}"[:300],
        actor=operator,
        details={"payout": payout.pk},
    )
    payout.status, payout.reference = PayoutStatus.REVERSED, reason[:200]
    payout.save(update_fields=["status", "reference", "updated_at"])
    return payout


def _amount(value: Decimal | str) -> Decimal:
    try:
        return parse_amount(value)
    except ValueError as exc:
        raise LedgerError(f"Invalid amount: {exc}", field="amount") from None
