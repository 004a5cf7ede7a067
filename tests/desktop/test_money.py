"""Amounts shown with the precision they have (desktop/money.py): the tray, the status
window, `gpuflex-node status` and the web pages all format money through `amount`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from desktop.money import amount, credits

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0.000842", "0.000842"),  # 14 paid tasks of a CPU node: was "0.00 credits"
        ("0.00084217", "0.000842"),
        ("0.0001", "0.0001"),
        ("0.000001", "0.000001"),  # the ledger's smallest amount
        ("0.0000004", "0.00"),  # below the ledger's precision
        ("0.5", "0.50"),
        ("0.123456", "0.123"),
        ("0.120000", "0.12"),
        ("0.999999", "1.00"),
        ("3.4", "3.40"),
        ("12.345", "12.35"),
        ("1234", "1,234.00"),
        ("0", "0.00"),
        ("0.000000", "0.00"),
        ("-0.000842", "-0.000842"),
        (0.25, "0.25"),
        ("not money", "not money"),
        ("NaN", "NaN"),
    ],
)
def test_amount_keeps_the_digits_an_amount_has(value, shown) -> None:
    assert amount(value) == shown


def test_credits_use_the_same_digits_with_a_rate_too() -> None:
    assert credits("0.000842") == "0.000842 credits"
    assert credits("12.5") == "12.50 credits"
    assert credits("0.0005", ("USD", "2")) == "0.0005 credits (≈ 0.001 USD)"


def test_every_surface_formats_money_through_the_one_helper() -> None:
    """The tray, the status window, the node CLI and the web's template filter import it."""
    users = {
        "desktop/gui/tray.py": "credits",
        "desktop/gui/status_window.py": "credits",
        "desktop/cli.py": "credits",
        "marketplace/web/templatetags/figures.py": "amount",
        "marketplace/web/views/provider.py": "amount",
    }
    for path, name in users.items():
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        imports = {
            (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert ("desktop.money", name) in imports, path
