"""Topic names: one place that spells them, for the ringers and the streams alike."""

from __future__ import annotations

OPERATOR = "operator"


def job(job_id: object) -> str:
    return f"job:{job_id}"


def money(user_id: object) -> str:
    """A user's balances and earnings: a buyer's credit, a provider's earnings."""
    return f"money:{user_id}"
