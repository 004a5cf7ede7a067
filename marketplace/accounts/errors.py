"""Account errors: each a clear sentence with an API code (see marketplace/jobs/errors.py)."""

from __future__ import annotations

from marketplace.jobs.errors import MarketplaceError


class KeyLimitReached(MarketplaceError):
    status = 409
    code = "key_limit_reached"
