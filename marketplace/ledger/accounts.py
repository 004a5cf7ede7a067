"""Named accounts, created on first use: one place that knows every account's code."""

from __future__ import annotations

from marketplace.accounts.models import User
from marketplace.jobs.models import Job
from marketplace.ledger.models import Account, AccountKind


def _get(code: str, kind: str, **owner: object) -> Account:
    account, _ = Account.objects.get_or_create(code=code, defaults={"kind": kind, **owner})
    return account


def buyer_credit(user: User | int) -> Account:
    uid = user if isinstance(user, int) else user.pk
    return _get(f"buyer:{uid}", AccountKind.BUYER_CREDIT, user_id=uid)


def job_escrow(job: Job) -> Account:
    return _get(f"escrow:{job.pk}", AccountKind.JOB_ESCROW, job=job)


def provider_earnings(user: User | int) -> Account:
    uid = user if isinstance(user, int) else user.pk
    return _get(f"earnings:{uid}", AccountKind.PROVIDER_EARNINGS, user_id=uid)


def payouts_pending() -> Account:
    return _get("platform:payouts", AccountKind.PAYOUTS_PENDING)


def platform_fees() -> Account:
    return _get("platform:fees", AccountKind.PLATFORM_FEES)


def external_grants() -> Account:
    return _get("world:grants", AccountKind.EXTERNAL_GRANTS)


def external_chain() -> Account:
    return _get("world:chain", AccountKind.EXTERNAL_CHAIN)


def external_payouts() -> Account:
    return _get("world:payouts", AccountKind.EXTERNAL_PAYOUTS)
