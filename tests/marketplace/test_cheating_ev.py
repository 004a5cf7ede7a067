"""The expected value of cheating (marketplace/ledger/cheating_ev.py, docs/money.md): the
closed form agrees with the cycle played task by task, and the doc's figures hold."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from marketplace.ledger.cheating_ev import (
    Rates,
    break_even_closed,
    break_even_tasks,
    cheat_ev_ratio,
    expected,
    simulate,
)

DEFAULTS = Rates(check_rate=0.1, tasks_per_hold=0, probation_tasks=3)


@pytest.mark.parametrize(
    ("share", "hold"), [(1.0, 0), (1.0, 5), (1.0, 20), (0.3, 5), (0.05, 0), (0.05, 20)]
)
def test_the_closed_form_is_what_the_cycle_plays(share: float, hold: int) -> None:
    rates = replace(DEFAULTS, cheat_share=share, tasks_per_hold=hold)
    closed, played = expected(rates), simulate(rates, tasks=200_000, seed=7)
    assert played.ratio == pytest.approx(closed.ratio, abs=0.02)


def test_without_a_hold_cheating_pays_and_the_default_hold_stops_it() -> None:
    assert cheat_ev_ratio(DEFAULTS) > 1.5  # docs/money.md: 1.62
    # a node running 5-minute tasks through a 7-day hold, or one task every hour
    assert cheat_ev_ratio(replace(DEFAULTS, tasks_per_hold=7 * 24 * 12)) < 0.3
    assert cheat_ev_ratio(replace(DEFAULTS, tasks_per_hold=7 * 24)) < 0.8
    assert break_even_tasks(DEFAULTS) == 6
    # a cost eating most of the pay needs a longer hold: honest work earns little then
    assert break_even_tasks(replace(DEFAULTS, cost_share=0.9)) > 12


@pytest.mark.parametrize("cost", [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
@pytest.mark.parametrize("detection", [1.0, 0.5])
def test_the_break_even_hold_has_a_closed_form(cost: float, detection: float) -> None:
    rates = replace(DEFAULTS, cost_share=cost, detection=detection)
    assert break_even_closed(rates) == break_even_tasks(rates)


def test_the_ratio_falls_as_the_hold_covers_more_tasks() -> None:
    ratios = [cheat_ev_ratio(replace(DEFAULTS, tasks_per_hold=k)) for k in range(0, 40, 3)]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > 1 > ratios[-1]


def test_no_checks_means_cheating_always_pays() -> None:
    rates = replace(DEFAULTS, check_rate=0.0, tasks_per_hold=10_000)
    assert expected(rates).pays and break_even_tasks(rates) is None


def test_bad_rates_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="check_rate"):
        Rates(check_rate=1.5, tasks_per_hold=1)
    with pytest.raises(ValueError, match="cost_share"):
        Rates(check_rate=0.1, tasks_per_hold=1, cost_share=1.0)


def test_it_imports_no_django() -> None:
    """The bench imports it without a configured Django."""
    code = (
        "import sys, marketplace.ledger.cheating_ev; "
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if 'django' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
