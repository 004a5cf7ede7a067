"""Node health: one score from compute speed, network reliability, update quality and uptime.

Weights and tier thresholds follow the HyperGPU design (0.4 / 0.3 / 0.2 / 0.1; tiers at 0.8,
0.5 and 0.3). An excluded node is re-admitted only once its score clears the exclusion line
by a margin, so a node hovering at the boundary does not flap in and out every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Tier(StrEnum):
    HIGH = "high_priority"
    NORMAL = "normal"
    REDUCED = "reduced_work"
    EXCLUDED = "temporarily_excluded"


WEIGHTS = {"compute": 0.4, "network": 0.3, "quality": 0.2, "uptime": 0.1}
HIGH, NORMAL, REDUCED = 0.8, 0.5, 0.3
READMIT_MARGIN = 0.1
# Hard gates: a fast node whose updates disagree with everyone's, or that is rarely
# reachable, must not ride its compute score into the round.
QUALITY_FLOOR = 0.25
UPTIME_FLOOR = 0.25


@dataclass(frozen=True)
class NodeMeasurement:
    """What the coordinator knows of a node: its benchmark and probe, then each round's facts."""

    node_id: str
    step_s: float  # seconds per local step at the job's batch size
    rtt_s: float
    up_bps: float
    down_bps: float
    loss: float = 0.0
    transfers: int = 0
    failed_transfers: int = 0
    agreement: float | None = None  # cosine of its last update with the aggregate
    validation_failures: int = 0
    updates: int = 0
    uptime: float = 1.0  # share of the job's time it was reachable

    def effective_bps(self, upload: bool) -> float:
        """Throughput TCP can reach on this path (Mathis: MSS / RTT * 1.22 / sqrt(loss))."""
        link = self.up_bps if upload else self.down_bps
        if self.loss > 0:
            link = min(link, 8 * 1460 / self.rtt_s * 1.22 / math.sqrt(self.loss))
        return link


@dataclass(frozen=True)
class Health:
    score: float
    compute: float
    network: float
    quality: float
    uptime: float


def health(m: NodeMeasurement, reference_step_s: float) -> Health:
    """`reference_step_s` is the median node's step time: the median node scores 1 on compute."""
    compute = min(1.0, reference_step_s / m.step_s) if m.step_s > 0 else 0.0
    success = 1 - m.failed_transfers / m.transfers if m.transfers else 1.0
    latency = 1 / (1 + m.rtt_s)  # 50 ms: 0.95, 300 ms: 0.77, 2 s: 0.33
    network = success * latency * max(0.0, 1 - 5 * m.loss)
    agreement = 1.0 if m.agreement is None else (1 + m.agreement) / 2
    valid = 1 - m.validation_failures / m.updates if m.updates else 1.0
    quality = agreement * valid
    parts = {
        "compute": compute,
        "network": network,
        "quality": quality,
        "uptime": max(0.0, min(1.0, m.uptime)),
    }
    score = sum(WEIGHTS[k] * v for k, v in parts.items())
    return Health(score=score, **parts)


def classify(h: Health, previous: Tier | None = None) -> Tier:
    if h.quality < QUALITY_FLOOR or h.uptime < UPTIME_FLOOR:
        return Tier.EXCLUDED
    return tier(h.score, previous)


def tier(score: float, previous: Tier | None = None) -> Tier:
    if previous is Tier.EXCLUDED and score < REDUCED + READMIT_MARGIN:
        return Tier.EXCLUDED
    if score > HIGH:
        return Tier.HIGH
    if score > NORMAL:
        return Tier.NORMAL
    if score > REDUCED:
        return Tier.REDUCED
    return Tier.EXCLUDED
