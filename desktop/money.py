"""Money as people see it: in credits, the marketplace's unit (docs/money.md), shown with the
precision it has. One helper for every surface: the tray and status window, `gpuflex-node`,
and the web pages (marketplace/web/templatetags/figures.py), so a provider reads the same
figure everywhere.

Small amounts are the rule, not the exception: a few CPU-seconds of work earn fractions of a
cent, and the ledger keeps six places (a micro-credit). Two fixed decimals showed 14 paid
tasks as "0.00 credits"; `amount` keeps two decimals for sums of a credit or more and three
significant digits below that ("0.000842").

A currency is shown only beside a rate the marketplace gives. Today no endpoint of
docs/agent-api.md gives one (`agent/me` carries earnings in credits only), so the app shows
credits alone; `rate` is where such a figure would come in.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

# the ledger's precision (marketplace/ledger/money.py): nothing finer exists to show
LEDGER_PLACES = 6
SIGNIFICANT = 3


def amount(value: object) -> str:
    """An amount of credits as text: "12.50", "1,234.00", "0.42", "0.000842", "0.00".

    Two decimals from one credit up; below that, three significant digits (at least two
    decimals, trailing zeros past the second dropped), at most the ledger's six places.
    Anything that is not a finite number comes back as given."""
    try:
        value = Decimal(str(value).strip())
    except InvalidOperation:
        return str(value)
    if not value.is_finite():
        return str(value)
    magnitude = abs(value)
    places = 2
    if 0 < magnitude < 1:
        # position of the first significant digit after the point: 0.000842 -> 4
        first = -magnitude.adjusted()
        places = min(LEDGER_PLACES, max(2, first + SIGNIFICANT - 1))
    text = f"{value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):,}"
    if places > 2:  # 0.500 -> 0.50, 0.120 -> 0.12: no more digits than the amount has
        whole, _, frac = text.partition(".")
        text = f"{whole}.{frac[:2]}{frac[2:].rstrip('0')}"
    return "0.00" if Decimal(text.replace(",", "")) == 0 else text


def credits(value: object, rate: tuple[str, str] | None = None) -> str:
    """ "12.50 credits", "0.000842 credits"; with a (currency, per-credit) rate,
    "12.50 credits (≈ 12.50 USD)"."""
    text = f"{amount(value)} credits"
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return text
    if rate is not None and number.is_finite():
        currency, per_credit = rate
        text += f" (≈ {amount(number * Decimal(per_credit))} {currency})"
    return text
