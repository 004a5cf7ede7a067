"""Numbers that strangers write: money and counts in ASCII digits only.

Python's int() and Decimal(), and the regex class \\d, read any Unicode decimal digit:
"١٢٣" (Arabic-Indic) and "１２３" (full-width) are 123 to them, so a grant, a budget, a
price, an upload's size or a query parameter written in them was taken as a number that no
statement, export or log shows as what was typed. Every parser of an amount or a count goes
through here (marketplace/api/serializers/numbers.py for the API's fields, the web forms,
ledger.money.parse_amount, the pagination) and takes 0-9 only.
"""

from __future__ import annotations

import re

NOT_ASCII = "write numbers with the digits 0-9 only"
_WHOLE = re.compile(r"[+-]?[0-9]+")


def is_ascii_text(value: object) -> bool:
    """False for text with any character outside ASCII; True for anything else (an int, a
    Decimal, ASCII text), which the caller's own parsing then judges."""
    return not isinstance(value, str) or value.isascii()


def header_length(text: str | None) -> int | None:
    """A Content-Length's value if it is the digits 0-9 alone, else None (for the caller to
    refuse)."""
    return int(text) if text and text.isascii() and text.isdigit() else None


def whole_number(value: object) -> int:
    """A count from JSON: an int (not a bool), or text that `parse_whole` takes; ValueError
    for anything else (a float is not silently truncated)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return parse_whole(value)
    raise ValueError(f"{value!r} is not a whole number")


def parse_whole(text: str) -> int:
    """A whole number written as an optional sign and the digits 0-9, nothing else; raises
    ValueError (also past Python's 4,300-digit limit for int())."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        raise ValueError(f"{text[:40]!r} is not a whole number in the digits 0-9")
    return int(stripped)
