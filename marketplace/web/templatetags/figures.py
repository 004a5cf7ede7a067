"""Template filters for figures: amounts of credits with the precision they have (the same
helper as the contributor app's, desktop/money.py) and measurements with enough significant
digits to tell a CPU's 0.00277 TFLOP/s from nothing."""

from __future__ import annotations

import math

from django import template

from desktop.money import amount as _amount

register = template.Library()


@register.filter
def amount(value: object) -> str:
    """{{ balances.available|amount }}: "12.50", "0.000842"."""
    return "—" if value is None or value == "" else _amount(value)


def significant(value: object, digits: int = 3) -> str:
    """A measured figure with `digits` significant digits, never in exponent notation and
    never rounded to nothing: 82.6, 1,234, 0.00277; "—" for a missing or non-finite one."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "—"
    if not math.isfinite(number):
        return "—"
    if number == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(number))))
    return f"{number:,.{places}f}"


@register.filter(name="significant")
def significant_filter(value: object, digits: int = 3) -> str:
    """{{ row.tflops|significant }}"""
    return significant(value, digits)
