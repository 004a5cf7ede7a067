"""Credits as fixed-point decimals: six places (a micro-credit), like a USD stablecoin."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from marketplace.numbers import NOT_ASCII, is_ascii_text

DECIMAL_PLACES = 6
MAX_DIGITS = 20
QUANTUM = Decimal(1).scaleb(-DECIMAL_PLACES)
ZERO = Decimal(0).quantize(QUANTUM)
# The most one amount may be. The columns are NUMERIC(20, 6), but SQLite (the embedded
# default) keeps only 15 significant digits of a number: 99999999999999.999999 came back as
# 100000000000000, which no longer fits 20 digits, and every read of it failed. 15 digits with
# six places leave nine before the point: 999,999,999.999999 credits round-trips exactly on
# every database, and sums of such amounts stay far inside Decimal's 28-digit context.
EXACT_DIGITS = 15
MAX_AMOUNT = Decimal(10) ** (EXACT_DIGITS - DECIMAL_PLACES) - QUANTUM
# plain decimal notation with an optional exponent; no NaN, Infinity or digit separators
# (ASCII: \d and Decimal() also read Arabic-Indic and full-width digits, marketplace/numbers.py)
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def q(value: Decimal | int | str) -> Decimal:
    """Round to the ledger's precision, half to even (no drift over many charges)."""
    return Decimal(value).quantize(QUANTUM, rounding=ROUND_HALF_EVEN)


def parse_amount(value: object, field: str = "amount") -> Decimal:
    """A positive amount of at most MAX_AMOUNT credits and six places, given as a string,
    int or Decimal; floats are refused (they are inexact), and so is anything that would be
    rounded or could not be stored exactly. Raises ValueError naming `field`."""
    if isinstance(value, float):
        raise ValueError(f"{field}: give money as a decimal string, not a float ({value!r})")
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise ValueError(f"{field}: {value!r} is not a decimal number")
    text = str(value).strip()
    if not is_ascii_text(text):
        raise ValueError(f"{field}: {NOT_ASCII}, got {text[:40]!r}")
    if len(text) > 40 or not _NUMBER.fullmatch(text):
        raise ValueError(f"{field}: {text[:40]!r} is not a decimal number")
    try:
        amount = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid numbers
        raise ValueError(f"{field}: {text!r} is not a decimal number") from None
    if amount <= 0:
        raise ValueError(f"{field}: must be a positive amount, got {text}")
    if amount > MAX_AMOUNT:
        raise ValueError(f"{field}: at most {MAX_AMOUNT} credits, got {text}")
    # compared before rounding: an amount that rounding would change is refused, not altered
    if amount != amount.quantize(QUANTUM):
        raise ValueError(f"{field}: at most {DECIMAL_PLACES} decimal places, got {text}")
    return q(amount)


def to_units(amount: Decimal, units_per_credit: int) -> int:
    """Credits to a token's integer base units; exact, or an error."""
    units = amount * units_per_credit
    if units != units.to_integral_value():
        raise ValueError(f"{amount} credits is not a whole number of base units")
    return int(units)


def from_units(units: int, units_per_credit: int) -> Decimal:
    """Base units to credits, rounded down to the ledger's precision (dust stays on chain)."""
    return (Decimal(units) / units_per_credit).quantize(QUANTUM, rounding="ROUND_DOWN")
