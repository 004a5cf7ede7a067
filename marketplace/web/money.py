"""The web pages' only door to the ledger (marketplace/ledger/).

Imports happen inside each function so that every page still renders where the ledger app is
missing or older: a widget whose figure is None says "not available" instead of failing.
"""

from __future__ import annotations

import datetime
import importlib
from decimal import Decimal
from typing import Any

from marketplace.accounts.models import User


def _ledger(module: str) -> Any | None:
    try:
        return importlib.import_module(f"marketplace.ledger.{module}")
    except ImportError:
        return None


def _call(module: str, name: str, *args: Any, **kwargs: Any) -> Any | None:
    mod = _ledger(module)
    fn = getattr(mod, name, None) if mod is not None else None
    return fn(*args, **kwargs) if fn is not None else None


def job_costs(job: Any) -> Any | None:
    """budget, held, spent, provider_share, platform_fee, bonus, redundancy_cost, refunded."""
    return _call("selectors", "job_costs", job)


def balances(user: User) -> Any | None:
    """available, held, earnings, pending_payouts, paid_out."""
    return _call("selectors", "balances", user)


def earnings_series(user: User, days: int = 30) -> list[tuple[datetime.date, Decimal]] | None:
    return _call("selectors", "earnings_series", user, days=days)


def earnings_by_node(user: User) -> list[dict[str, Any]] | None:
    return _call("selectors", "earnings_by_node", user)


def payouts_for(user: User) -> Any | None:
    return _call("selectors", "payouts_for", user)


def reconcile() -> Any | None:
    """The reconciliation report (.ok, .problems, .checked), or None without a ledger."""
    return _call("reconcile", "reconcile")


def payouts_available() -> bool:
    mod = _ledger("services")
    return mod is not None and hasattr(mod, "request_payout")


def request_payout(*, user: User, amount: Decimal, wallet_address: str, key: str) -> Any:
    """Raises LookupError without a ledger; the ledger's own errors pass through."""
    mod = _ledger("services")
    if mod is None or not hasattr(mod, "request_payout"):
        raise LookupError("Payouts are not available on this server yet.")
    return mod.request_payout(
        user=user, amount=amount, wallet_address=wallet_address, idempotency_key=key
    )


def money_errors() -> tuple[type[BaseException], ...]:
    """The exception classes a money call may raise with a sentence meant for the user."""
    mod = _ledger("errors")
    base = getattr(mod, "LedgerError", None) if mod is not None else None
    return (base,) if isinstance(base, type) else ()
