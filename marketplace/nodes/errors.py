"""Node errors the API answers as 4xx (the shape of marketplace.api.errors)."""

from __future__ import annotations

from marketplace.jobs.errors import MarketplaceError


class EnrollmentRequired(MarketplaceError):
    """A platform node without a valid operator enrollment token."""

    status = 403
    code = "enrollment_required"


class InvalidNodeData(MarketplaceError):
    """A node's figure that no schema could hold (a federated sample count, say)."""

    code = "invalid"
