"""Ledger errors: each a clear sentence with an API code (see marketplace/jobs/errors.py)."""

from __future__ import annotations

from marketplace.jobs.errors import MarketplaceError


class LedgerError(MarketplaceError):
    code = "ledger_error"


class Unbalanced(LedgerError):
    """A programming error: a transaction whose entries do not sum to zero."""

    status = 500
    code = "ledger_unbalanced"


class InsufficientFunds(LedgerError):
    status = 402
    code = "insufficient_funds"


class InsufficientCredit(InsufficientFunds):
    code = "insufficient_credit"


class InvalidPayout(LedgerError):
    code = "invalid_payout"


class IdempotencyConflict(LedgerError):
    status = 409
    code = "idempotency_conflict"
