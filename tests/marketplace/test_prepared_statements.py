"""The claim's statements are prepared on PostgreSQL (server/prepared.py): planned once per
connection, not per claim; and array parameters written as PostgreSQL's array text read
back as the values given."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import connection, transaction

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


def _values(plan: object, key: str) -> list[object]:
    """Every value of `key` in an EXPLAIN (FORMAT JSON) plan, its nested nodes included."""
    if isinstance(plan, dict):
        here = [plan[key]] if key in plan else []
        return here + [x for v in plan.values() for x in _values(v, key)]
    if isinstance(plan, list):
        return [x for v in plan for x in _values(v, key)]
    return []


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_candidates_generic_plan_reads_the_pending_index_before_any_analyze(
    make_agent, submit
) -> None:
    """Many of a round's tasks leased, an earlier round's pending tasks still in the table
    (its job stopped): the cached generic plan of the candidate read walks the round's
    pending primaries' partial index, neither an index that leads through every leased task
    of the round first nor one that leads through the other round's pending tasks. (A status
    sent as a parameter hides the indexes' predicates from a generic plan: the index could
    not be read at all.)"""
    from marketplace.jobs.models import Job

    agents = [make_agent() for _ in range(4)]
    stopped = submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 300}})
    Job.objects.filter(pk=stopped["id"]).update(status="completed")
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 300}}, budget="900")
    with connection.cursor() as cursor:  # as autovacuum would soon after: all pending
        cursor.execute("ANALYZE rounds_task")
    seen: list[tuple[str, object]] = []

    def keep(execute, sql, params, many, context):
        if "WITH affine" in sql:
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        for agent in agents:
            for _ in range(12):
                assert agent.client.post("/api/v1/agent/claim?max=8").status_code == 200
    from marketplace.rounds.models import Task

    leased, pending = (Task.objects.filter(status=s).count() for s in ("leased", "pending"))
    assert leased >= 100 and pending >= 100, (leased, pending)
    sql, params = [(sql, params) for sql, params in seen if "t.replica = 0" in sql][-1]
    # the statement as a prepared statement's generic plan sees it: its values parameters
    names = sorted(params)  # type: ignore[call-overload]
    text = sql
    for i, name in enumerate(names, 1):
        text = text.replace(f"%({name})s", f"${i}")
    args = ", ".join(f"'{params[n]}'" if isinstance(params[n], str) else str(params[n])
                     for n in names)  # fmt: skip
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE generic_candidates AS {text}")
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE generic_candidates({args})")
        plan = cursor.fetchone()[0]
        cursor.execute("DEALLOCATE generic_candidates")
    names = set(_values(plan, "Index Name"))
    assert "task_pending_primary" in names and "task_unique_replica" not in names, names
    # the node's own replicas are probed per candidate, not read as an anti join's whole side
    assert not any("Anti" in kind for kind in _values(plan, "Join Type")), plan


@postgres_only
@pytest.mark.django_db
def test_gpuflex_reserve_plans_each_call() -> None:
    """Its statements' plans are made per call (ledger 0009): a generic plan cached while
    the reservations were few scanned them all once they were many."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = 'gpuflex_reserve'")
        assert cursor.fetchone()[0] == ["plan_cache_mode=force_custom_plan"]
