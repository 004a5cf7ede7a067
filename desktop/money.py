"""Money as the owner sees it: in credits, the marketplace's unit (docs/money.md).

A currency is shown only beside a rate the marketplace gives. Today no endpoint of
docs/agent-api.md gives one (`agent/me` carries earnings in credits only), so the app shows
credits alone; `rate` is where such a figure would come in.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation


def credits(amount: object, rate: tuple[str, str] | None = None) -> str:
    """ "12.50 credits"; with a (currency, per-credit) rate, "12.50 credits (≈ 12.50 USD)"."""
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        return f"{amount} credits"
    if not value.is_finite():
        return f"{amount} credits"
    text = f"{value.quantize(Decimal('0.01')):,} credits"
    if rate is not None:
        currency, per_credit = rate
        text += f" (≈ {(value * Decimal(per_credit)).quantize(Decimal('0.01')):,} {currency})"
    return text
