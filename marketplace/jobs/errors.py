"""Domain errors the API turns into 4xx answers: each has a stable code and a sentence."""

from __future__ import annotations

from typing import Any


class MarketplaceError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidSpec(MarketplaceError):
    code = "invalid_spec"


class InvalidDataset(MarketplaceError):
    code = "invalid_dataset"


class TooLarge(MarketplaceError):
    status = 413
    code = "too_large"


class Conflict(MarketplaceError):
    status = 409
    code = "conflict"


class NotFound(MarketplaceError):
    status = 404
    code = "not_found"


class LocalDataset(MarketplaceError):
    status = 409
    code = "local_dataset"


class UpdateRejectedError(MarketplaceError):
    status = 422
    code = "update_rejected"
