"""Proving the ledger's invariants (`gpuflex manage reconcile`).

Each check returns the problems it found as sentences; the report lists what was checked, so
an empty problem list means something. With the chain enabled the ledger is also compared
with the escrow contract (chain.reconcile_chain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from marketplace.jobs.models import Job, JobStatus
from marketplace.ledger.holds import running
from marketplace.ledger.models import (
    NON_NEGATIVE,
    Account,
    EarningsHold,
    Entry,
    Payout,
    PayoutStatus,
    Transaction,
    TxKind,
)
from marketplace.ledger.money import ZERO, q
from marketplace.ledger.sums import exact_sum, exact_sums_by
from marketplace.rounds.models import Round, RoundStatus


@dataclass
class Report:
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    checked_at: str = ""

    def add(self, name: str, problems: list[str]) -> None:
        self.checked.append(name)
        self.problems.extend(problems)
        self.ok = not self.problems

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "checked": self.checked,
            "checked_at": self.checked_at,
        }


def _balances() -> dict[int, Decimal]:
    return {k: q(v) for k, v in exact_sums_by(Entry.objects.all(), "account_id").items()}


def check_zero_sum() -> list[str]:
    total = exact_sum(Entry.objects.all())
    problems = [f"All entries sum to {total}, not 0."] if total != 0 else []
    sums = exact_sums_by(Entry.objects.all(), "transaction__key")
    problems += [f"Transaction {key} sums to {s}." for key, s in sorted(sums.items()) if s != 0]
    empty = Transaction.objects.filter(entries__isnull=True).values_list("key", flat=True)
    problems += [f"Transaction {k} has no entries." for k in empty]
    return problems


def check_non_negative(bal: dict[int, Decimal]) -> list[str]:
    return [
        f"Account {a.code} is at {bal[a.pk]}, below zero."
        for a in Account.objects.filter(kind__in=NON_NEGATIVE)
        if bal.get(a.pk, ZERO) < 0
    ]


def _stuck_rounds() -> dict[object, tuple[int, int, object]]:
    """Job id -> (round number, restarts, aggregating since) of rounds whose aggregation is
    stuck: restarted at least once (it failed or its worker was lost), or running past
    STUCK_AGGREGATION_S. Such a round's escrow is not on its way to anyone."""
    cutoff = timezone.now() - timedelta(seconds=settings.GPUFLEX["STUCK_AGGREGATION_S"])
    rows = (
        Round.objects.filter(status=RoundStatus.AGGREGATING)
        .filter(Q(aggregation_restarts__gt=0) | Q(aggregating_since__lt=cutoff))
        .values_list("job_id", "number", "aggregation_restarts", "aggregating_since")
    )
    return {job_id: (number, restarts, since) for job_id, number, restarts, since in rows}


def check_escrow(bal: dict[int, Decimal]) -> list[str]:
    """Open jobs' escrow equals their hold less their charges; ended jobs hold nothing (but
    while their last round's aggregation, not stuck, still pays its verified work); no
    budget is held by a job whose aggregation is stuck."""
    problems = []
    charges = Entry.objects.filter(transaction__kind=TxKind.CHARGE, account__job__isnull=False)
    charged = {k: q(-v) for k, v in exact_sums_by(charges, "account__job_id").items()}
    stuck = _stuck_rounds()
    aggregating = set(
        Round.objects.filter(status=RoundStatus.AGGREGATING).values_list("job_id", flat=True)
    )
    for account in Account.objects.filter(job__isnull=False).select_related("job"):
        job, held = account.job, bal.get(account.pk, ZERO)
        if job.is_active:
            expected = q(job.budget) - charged.get(job.pk, ZERO)
            if held != expected:
                problems.append(
                    f"Job {job.pk} escrow is {held}; its budget less charges is {expected}."
                )
        elif held != 0 and (job.pk not in aggregating or job.pk in stuck):
            problems.append(f"Job {job.pk} is {job.status} but still holds {held} in escrow.")
        if held != 0 and job.pk in stuck:
            number, restarts, since = stuck[job.pk]
            problems.append(
                f"Job {job.pk} ({job.status}) holds {held} in escrow behind a stuck "
                f"aggregation: round {number} aggregating since {since:%Y-%m-%d %H:%M:%S}, "
                f"restarted {restarts} times."
            )
    unheld = Job.objects.filter(
        status__in=[JobStatus.RUNNING, JobStatus.PAUSED], escrow_account__isnull=True
    ).values_list("pk", flat=True)
    problems += [f"Job {pk} is open but holds no escrow." for pk in unheld]
    return problems


def check_charges() -> list[str]:
    """Only credited results are charged (once each: the schema's one-to-one key)."""
    problems = [
        f"Result {pk} was charged but is not credited (rejected or unverified work)."
        for pk in Transaction.objects.filter(kind=TxKind.CHARGE)
        .filter(Q(task_result__credited=False) | Q(task_result__isnull=True))
        .values_list("task_result_id", flat=True)
    ]
    return problems


def check_holds(bal: dict[int, Decimal]) -> list[str]:
    """Held earnings are in their provider's earnings (payouts take only what no hold keeps),
    and each hold is the net of a charge its node's work was paid by."""
    problems = []
    held = exact_sums_by(running(EarningsHold.objects.all()), "user_id")
    for uid, amount in sorted(held.items()):
        have = _balance_of(f"earnings:{uid}", bal)
        if q(amount) > have:
            problems.append(f"User {uid} has {q(amount)} of earnings on hold but holds {have}.")
    wrong = EarningsHold.objects.exclude(charge__kind=TxKind.CHARGE).values_list("pk", flat=True)
    problems += [f"Hold {pk} is not of a charge." for pk in wrong]
    return problems


def _balance_of(code: str, bal: dict[int, Decimal]) -> Decimal:
    """Without creating the account (a check must not write)."""
    pk = Account.objects.filter(code=code).values_list("pk", flat=True).first()
    return bal.get(pk, ZERO) if pk is not None else ZERO


def check_payouts(bal: dict[int, Decimal]) -> list[str]:
    problems = []
    requested = exact_sum(Payout.objects.filter(status=PayoutStatus.REQUESTED))
    pending = _balance_of("platform:payouts", bal)
    if q(requested or ZERO) != pending:
        problems.append(
            f"Requested payouts add up to {q(requested or ZERO)}; pending holds {pending}."
        )
    paid = exact_sum(Payout.objects.filter(status=PayoutStatus.PAID))
    out = _balance_of("world:payouts", bal)
    if q(paid or ZERO) != out:
        problems.append(f"Payouts marked paid add up to {q(paid or ZERO)}; {out} left the ledger.")
    return problems


def reconcile(with_chain: bool = True) -> Report:
    report = Report(checked_at=timezone.now().isoformat())
    bal = _balances()
    report.add("entries sum to zero, per transaction and overall", check_zero_sum())
    report.add("user and platform accounts are not below zero", check_non_negative(bal))
    report.add(
        "escrow equals open jobs' holds less charges; no ended or stuck job holds any",
        check_escrow(bal),
    )
    report.add("only credited results are charged", check_charges())
    report.add("payout records agree with the payout accounts", check_payouts(bal))
    report.add("held earnings are within their providers' earnings", check_holds(bal))
    if with_chain:
        from marketplace.ledger.chain import chain_client, reconcile_chain

        client = chain_client()
        if client is not None:
            report.add("the ledger agrees with the escrow contract", reconcile_chain(client))
    return report
