"""Credits as fixed-point decimals: six places (a micro-credit), like a USD stablecoin."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

DECIMAL_PLACES = 6
MAX_DIGITS = 20
QUANTUM = Decimal(1).scaleb(-DECIMAL_PLACES)
ZERO = Decimal(0).quantize(QUANTUM)


def q(value: Decimal | int | str) -> Decimal:
    """Round to the ledger's precision, half to even (no drift over many charges)."""
    return Decimal(value).quantize(QUANTUM, rounding=ROUND_HALF_EVEN)


def parse_amount(value: object, field: str = "amount") -> Decimal:
    """A positive amount given as a string or Decimal; floats are refused (they are inexact)."""
    if isinstance(value, float):
        raise ValueError(f"{field}: give money as a decimal string, not a float ({value!r})")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{field}: {value!r} is not a decimal number") from None
    if not amount.is_finite() or amount <= 0:
        raise ValueError(f"{field}: must be a positive amount, got {value}")
    if amount != amount.quantize(QUANTUM):
        raise ValueError(f"{field}: at most {DECIMAL_PLACES} decimal places, got {value}")
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
