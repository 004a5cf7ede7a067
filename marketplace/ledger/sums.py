"""Exact sums of decimal columns on every database.

PostgreSQL sums NUMERIC exactly. SQLite stores each amount exactly enough for Django to read
it back to the column's precision, but its SUM() adds binary floats: a transaction of
micro-credits can come out at 1e-21 instead of 0, and large token amounts lose digits. On
SQLite these functions therefore add the rows up in Python, as Decimals.
"""

from __future__ import annotations

from collections.abc import Hashable
from decimal import Decimal

from django.db import connection
from django.db.models import QuerySet, Sum


def exact_sum(qs: QuerySet, field: str = "amount") -> Decimal:
    if connection.vendor == "sqlite":
        return sum(qs.values_list(field, flat=True), Decimal(0))
    return qs.aggregate(s=Sum(field))["s"] or Decimal(0)


def exact_sums_by(qs: QuerySet, key: str, field: str = "amount") -> dict[Hashable, Decimal]:
    out: dict[Hashable, Decimal] = {}
    if connection.vendor == "sqlite":
        for k, v in qs.values_list(key, field):
            out[k] = out.get(k, Decimal(0)) + v
        return out
    for row in qs.order_by().values(key).annotate(s=Sum(field)):
        out[row[key]] = row["s"] or Decimal(0)
    return out
