"""The claim's statements are prepared on PostgreSQL (server/prepared.py): planned once per
connection, not per claim; and array parameters written as PostgreSQL's array text read
back as the values given."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import connection

from marketplace.server.prepared import array_literal, prepared_cursor
from tests.marketplace.helpers import SMALL_SPEC

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
)


def _prepared() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        return dict(cursor.fetchall())


@postgres_only
def test_a_claims_statements_are_prepared_once_and_reused(make_agent, submit) -> None:
    agent = make_agent()
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 40}})
    for _ in range(3):
        assert len(agent.client.post("/api/v1/agent/claim?max=2").json()["tasks"]) == 2
    runs = _prepared()
    candidates = [n for sql, n in runs.items() if "WITH affine AS MATERIALIZED" in sql]
    reserve = [n for sql, n in runs.items() if "gpuflex_reserve" in sql]
    lease = [n for sql, n in runs.items() if sql.lstrip().startswith("UPDATE rounds_task")]
    # one prepared statement each, run by every claim (the first claim's included)
    assert candidates == [3] and reserve == [3] and lease == [3], runs


@postgres_only
def test_off_nothing_is_prepared(make_agent, submit, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"DB_PREPARE": False}
    agent = make_agent()
    submit(SMALL_SPEC)
    before = {sql: n for sql, n in _prepared().items() if "WITH affine" in sql}
    assert len(agent.client.post("/api/v1/agent/claim?max=2").json()["tasks"]) == 2
    assert {sql: n for sql, n in _prepared().items() if "WITH affine" in sql} == before


@postgres_only
@pytest.mark.django_db
def test_array_literals_read_back_as_given() -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    texts = ["plain", 'a "quoted" one', "back\\slash", "comma, brace {}", "", None, "NULL"]
    numbers = [Decimal("0.000001"), Decimal("12345678.5"), None, Decimal("1E+2")]
    floats = [0.1, 1e-07, 3.0, 2.5e300]
    with prepared_cursor() as cursor:
        cursor.execute(
            "SELECT %s::uuid[], %s::text[], %s::numeric[], %s::float8[], %s::bigint[]",
            [array_literal(v) for v in (ids, texts, numbers, floats, [1, -2, 2**40])],
        )
        got = cursor.fetchone()
    assert got == (ids, texts, numbers, floats, [1, -2, 2**40])
