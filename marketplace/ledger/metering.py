"""What one accepted task costs: pure arithmetic, written down in docs/money.md.

    metered_s   = min(reported compute seconds, seconds the server saw between lease and upload,
                      the lease's bounded seconds)
    speed       = min(clamp(billed fp32 TFLOP/s / reference TFLOP/s, min_speed, max_speed),
                      the speed the lease's reservation was made at)
    base        = price per reference GPU-hour x metered_s x speed / 3600
    bonus       = base x bonus_max x quality,   quality = clamp(cosine, 0, 1)
    gross       = base + bonus                  (what the buyer's escrow pays)
    fee         = gross x fee_rate              (the platform's share)
    net         = gross - fee                   (the provider's earnings)

A node's price is per *reference* GPU-hour: a GPU twice as fast as the reference finishes in
half the time and is credited twice the speed, so it earns the same per task and more per
hour. The server's own clock bounds the time a node can bill; the speed factor is clamped so
that an inflated benchmark cannot multiply it without limit, and the billed TFLOP/s are the
node's one speed figure (speed.py: what its tasks show, its benchmark as the prior).

A lease reserves `max_charge`: the same meter at the lease's bounded seconds, its speed and
price and the full quality bonus, so that no charge of that lease can exceed it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from marketplace.ledger.money import ZERO, q


@dataclass(frozen=True)
class Rules:
    fee_rate: Decimal
    bonus_max: Decimal
    reference_tflops: float
    min_speed: float
    max_speed: float

    @classmethod
    def from_settings(cls) -> Rules:
        from django.conf import settings

        g = settings.GPUFLEX
        return cls(
            fee_rate=Decimal(str(g["PLATFORM_FEE"])),
            bonus_max=Decimal(str(g["QUALITY_BONUS_MAX"])),
            reference_tflops=float(g["REFERENCE_FP32_TFLOPS"]),
            min_speed=float(g["MIN_SPEED_FACTOR"]),
            max_speed=float(g["MAX_SPEED_FACTOR"]),
        )


@dataclass(frozen=True)
class Meter:
    reported_s: float
    observed_s: float
    metered_s: float
    speed: float
    price_per_hour: Decimal
    base: Decimal
    quality: float
    bonus: Decimal
    gross: Decimal
    fee: Decimal
    net: Decimal

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Decimal) else v for k, v in asdict(self).items()}


def speed_factor(fp32_tflops: float | None, rules: Rules) -> float:
    """A node without a (positive) benchmark is billed at the slowest speed, not the reference:
    leaving the benchmark out must never pay more than reporting it."""
    score = fp32_tflops if fp32_tflops and fp32_tflops > 0 else 0.0
    return min(max(score / rules.reference_tflops, rules.min_speed), rules.max_speed)


def quality(cosine: float | None) -> float:
    """How well an update agreed with the round's consensus direction (the aggregator's
    cosine to the coordinate-wise median update); unknown (under three updates) earns none."""
    if cosine is None:
        return 0.0
    return min(max(cosine, 0.0), 1.0)


def meter(
    *,
    reported_s: float,
    observed_s: float,
    fp32_tflops: float | None,
    price_per_hour: Decimal,
    cosine: float | None,
    rules: Rules,
    max_seconds: float | None = None,
    max_speed: float | None = None,
) -> Meter:
    """`max_seconds` and `max_speed` are the bounds a lease's reservation was made with."""
    metered = max(0.0, min(reported_s, observed_s))
    if max_seconds is not None:
        metered = min(metered, max_seconds)
    speed = speed_factor(fp32_tflops, rules)
    if max_speed is not None:
        speed = min(speed, max_speed)
    return priced(
        metered_s=metered,
        speed=speed,
        price_per_hour=price_per_hour,
        qual=quality(cosine),
        rules=rules,
        reported_s=reported_s,
        observed_s=observed_s,
    )


# forward FLOPs per parameter and sample (a multiply and an add): what inference costs
INFER_FLOPS_PER_PARAM = 2


def seconds_per_sample(parameters: int, rules: Rules, floor_s: float = 0.0) -> float:
    """Reference-GPU seconds one sample's inference is billed as: its forward pass's FLOPs at
    the reference throughput, and never less than `floor_s` (reading, moving and writing a
    row costs time however small the model; settings INFERENCE_MIN_S_PER_SAMPLE)."""
    flops = INFER_FLOPS_PER_PARAM * max(parameters, 1) / (rules.reference_tflops * 1e12)
    return max(flops, floor_s)


def per_sample(
    *, samples: int, seconds_per_sample: float, price_per_hour: Decimal, rules: Rules
) -> Meter:
    """An inference task's charge: per sample processed, at the node's price per reference
    GPU-hour for `seconds_per_sample` reference seconds a sample. Neither the node's clock
    nor its speed enters: the same rows cost the same on any node at the same price."""
    seconds = samples * seconds_per_sample
    return priced(metered_s=seconds, speed=1.0, price_per_hour=price_per_hour, qual=0.0,
                  rules=rules)  # fmt: skip


def priced(
    *,
    metered_s: float,
    speed: float,
    price_per_hour: Decimal,
    qual: float,
    rules: Rules,
    reported_s: float | None = None,
    observed_s: float | None = None,
) -> Meter:
    # Decimal from repr of the floats keeps the arithmetic exact from here on
    hours = Decimal(repr(metered_s)) * Decimal(repr(speed)) / Decimal(3600)
    base = q(price_per_hour * hours)
    bonus = q(base * rules.bonus_max * Decimal(repr(qual)))
    gross = base + bonus
    fee = q(gross * rules.fee_rate)
    return Meter(
        reported_s=metered_s if reported_s is None else reported_s,
        observed_s=metered_s if observed_s is None else observed_s,
        metered_s=metered_s,
        speed=speed,
        price_per_hour=price_per_hour,
        base=base,
        quality=qual,
        bonus=bonus,
        gross=gross,
        fee=fee,
        net=gross - fee,
    )


def max_charge(*, seconds: float, speed: float, price_per_hour: Decimal, rules: Rules) -> Meter:
    """The most `meter` can ever produce for a lease bounded by `seconds` at speed factor
    `speed` and this price: every second billed, the full quality bonus. Each rounding step
    is monotone (half-even of a larger figure is never less), so any charge of that lease,
    metered with these bounds, is at most this gross."""
    return priced(metered_s=seconds, speed=speed, price_per_hour=price_per_hour, qual=1.0,
                  rules=rules)  # fmt: skip


def cap(m: Meter, available: Decimal, rules: Rules) -> tuple[Meter, Decimal]:
    """Scale a charge down to what the escrow still holds; returns the shortfall."""
    if m.gross <= available:
        return m, ZERO
    gross = max(available, ZERO)
    fee = q(gross * rules.fee_rate)
    capped = Meter(**{**asdict(m), "gross": gross, "fee": fee, "net": gross - fee})
    return capped, m.gross - gross
