"""Limit/offset pagination that cannot be asked for more rows than the database can count."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from marketplace.numbers import parse_whole


def _whole_number(request: Request, name: str, minimum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = parse_whole(raw)  # the digits 0-9 only; past 4300 digits a ValueError too
    except ValueError:
        raise ValidationError(
            {name: [f"Must be a whole number in the digits 0-9, not {raw[:40]!r}."]}
        ) from None
    if value < minimum:
        raise ValidationError({name: [f"Must be at least {minimum}."]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """A huge ?limit= reached SQL as LIMIT 10**20 (PostgreSQL: bigint out of range, a 500): it
    is clamped to max_limit. A limit or offset that is not a whole number is a 400 naming it
    (DRF silently used the default)."""

    max_limit = 500
    # rows are never counted past this; a larger offset is a 400 rather than a SQL error
    max_offset = 2**31 - 1

    def get_limit(self, request: Request) -> int | None:
        value = _whole_number(request, self.limit_query_param, minimum=1)
        return self.default_limit if value is None else min(value, self.max_limit)

    def get_offset(self, request: Request) -> int:
        value = _whole_number(request, self.offset_query_param, minimum=0)
        if value is not None and value > self.max_offset:
            raise ValidationError(
                {self.offset_query_param: [f"Must be at most {self.max_offset}."]}
            )
        return value or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        limit, offset = super().get_schema_operation_parameters(view)
        limit["schema"]["minimum"] = 1
        limit["description"] = (
            f"Number of results to return per page (default {self.default_limit}); "
            f"larger values than {self.max_limit} are treated as {self.max_limit}."
        )
        offset["schema"].update(minimum=0, maximum=self.max_offset)
        return [limit, offset]
