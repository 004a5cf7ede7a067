"""Network-aware training: node health, tiers and the adaptation policy."""

from trainer.adapt.health import Health, NodeMeasurement, Tier, classify, health, tier
from trainer.adapt.policy import NodePlan, PolicyState, RoundPlan, payload_bytes, plan_round

__all__ = [
    "Health",
    "NodeMeasurement",
    "NodePlan",
    "PolicyState",
    "RoundPlan",
    "Tier",
    "classify",
    "health",
    "payload_bytes",
    "plan_round",
    "tier",
]
