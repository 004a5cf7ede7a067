"""The charge formula (docs/money.md), as pure arithmetic."""

from __future__ import annotations

from decimal import Decimal

from marketplace.ledger.metering import Rules, cap, meter, speed_factor

RULES = Rules(
    fee_rate=Decimal("0.10"),
    bonus_max=Decimal("0.10"),
    reference_tflops=20.0,
    min_speed=0.01,
    max_speed=8.0,
)


def charge(**kw):
    args = dict(reported_s=3600.0, observed_s=3600.0, fp32_tflops=20.0,
                price_per_hour=Decimal("2.00"), cosine=None, rules=RULES)  # fmt: skip
    return meter(**(args | kw))


def test_an_hour_on_the_reference_gpu_costs_the_price() -> None:
    m = charge()
    assert (m.base, m.bonus, m.gross, m.fee, m.net) == (
        Decimal("2.000000"), Decimal("0.000000"), Decimal("2.000000"),
        Decimal("0.200000"), Decimal("1.800000"),
    )  # fmt: skip
    assert m.gross == m.fee + m.net


def test_a_faster_gpu_earns_the_same_per_task_for_finishing_sooner() -> None:
    slow = charge(reported_s=600.0, observed_s=600.0, fp32_tflops=20.0)
    fast = charge(reported_s=150.0, observed_s=150.0, fp32_tflops=80.0)  # 4x faster
    assert slow.gross == fast.gross == Decimal("0.333333")


def test_billable_time_is_bounded_by_the_servers_clock() -> None:
    honest = charge(reported_s=100.0, observed_s=500.0)
    inflated = charge(reported_s=5000.0, observed_s=100.0)
    assert honest.metered_s == inflated.metered_s == 100.0
    assert honest.gross == inflated.gross


def test_speed_is_clamped_and_a_missing_benchmark_pays_least() -> None:
    assert speed_factor(10_000.0, RULES) == 8.0
    assert speed_factor(None, RULES) == speed_factor(0.0, RULES) == 0.01
    assert speed_factor(-5.0, RULES) == 0.01
    assert charge(fp32_tflops=None).gross < charge(fp32_tflops=0.5).gross


def test_quality_bonus_is_capped_and_needs_agreement() -> None:
    assert charge(cosine=1.0).bonus == Decimal("0.200000")  # 10 % of base at most
    assert charge(cosine=5.0).bonus == Decimal("0.200000")
    assert charge(cosine=0.5).bonus == Decimal("0.100000")
    assert charge(cosine=-0.2).bonus == charge(cosine=None).bonus == 0
    m = charge(cosine=1.0)
    assert m.gross == m.base + m.bonus and m.fee == Decimal("0.220000")


def test_cap_scales_a_charge_down_to_the_escrow_and_reports_the_shortfall() -> None:
    m = charge()
    capped, short = cap(m, Decimal("0.5"), RULES)
    assert capped.gross == Decimal("0.5") and short == Decimal("1.5")
    assert capped.fee + capped.net == capped.gross
    same, none = cap(m, Decimal("5"), RULES)
    assert same == m and none == 0


def test_rounding_is_to_micro_credits_half_even() -> None:
    m = charge(reported_s=1.0, observed_s=1.0, price_per_hour=Decimal("0.0018"))
    assert m.base == Decimal("0.000000")  # 0.0000005 rounds to even
    m = charge(reported_s=3.0, observed_s=3.0, price_per_hour=Decimal("0.0018"))
    assert m.base == Decimal("0.000002")  # 0.0000015 rounds to even (up)
