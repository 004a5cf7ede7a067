"""A claim's first read on PostgreSQL: the node's row and the open rounds of the running jobs
with their jobs, in one statement.

A claim needs the node (its price, hardware, reliability: read fresh, never from the key
cache, so a price is never stale) and the open rounds (`scheduling.eligibility`). Read
apart they were two round trips and two ORM queries to build per claim (issue 36's profile:
the node's row 8 % of a claim's CPU, the rounds' read more). Here the statement's text and
each column's converters are made once per process; a row is the node's columns, then a
round's and its job's (NULL when no round is open), so a node with no work to look at still
gets its row. The row's last column holds the ids of the tasks the node has leased under the
claim's Idempotency-Key (`scheduling.claim_batch`): a re-sent claim is answered with those,
found in the same round trip (the `task_leased_claim` index: the node's few leases).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Model

from marketplace.jobs.models import Job, JobStatus
from marketplace.nodes.models import Node
from marketplace.rounds.models import Round, RoundStatus, Task, TaskStatus
from marketplace.server.prepared import constant, prepared_cursor


class _Reader:
    """One model's columns under a table alias, and how each value comes out of the
    database (the converters Django's compiler applies: JSON decoded, and so on)."""

    def __init__(self, model: type[Model], alias: str) -> None:
        self.model = model
        fields = model._meta.concrete_fields
        self.sql = ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in fields)
        self.width = len(fields)
        self.converters: list[tuple[int, list[Any], Any]] = []
        for i, f in enumerate(fields):
            col = f.get_col(alias)
            convs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if convs:
                self.converters.append((i, convs, col))

    def build(self, row: tuple[Any, ...]) -> Model:
        values = list(row)
        for i, convs, col in self.converters:
            for conv in convs:
                values[i] = conv(values[i], col, connection)
        return self.model.from_db(connection.alias, None, values)


@cache
def _statement() -> tuple[str, _Reader, _Reader, _Reader]:
    node, rnd, job = _Reader(Node, "n"), _Reader(Round, "r"), _Reader(Job, "j")
    sql = f"""
        SELECT {node.sql}, {rnd.sql}, {job.sql},
               ARRAY(SELECT t.id FROM {Task._meta.db_table} t
                     WHERE t.node_id = n.id AND t.status = {constant(TaskStatus.LEASED)}
                       AND t.claim_key = %s
                     ORDER BY t.replica, t.round_id, t.shard_id)
        FROM {Node._meta.db_table} n
        LEFT JOIN ({Round._meta.db_table} r
                   JOIN {Job._meta.db_table} j
                     ON j.id = r.job_id AND j.status = {constant(JobStatus.RUNNING)})
            ON r.status = {constant(RoundStatus.OPEN)}
        WHERE n.id = %s
    """
    return sql, node, rnd, job


def node_and_open_rounds(node_id: int, key: str | None = None) -> tuple[Node, list[Round], list]:
    """The node's row, every open round of a running job, each with its job (one Job
    instance per job), and the ids of the tasks it holds leased under the claim key `key`
    (none without one); Node.DoesNotExist when the node is gone."""
    sql, node_r, round_r, job_r = _statement()
    with prepared_cursor() as cursor:
        # a NULL key matches no task (`claim_key = NULL` is never true)
        cursor.execute(sql, [key, node_id])
        rows = cursor.fetchall()
    if not rows:
        raise Node.DoesNotExist(f"node {node_id} does not exist")
    a, b = node_r.width, node_r.width + round_r.width
    node = node_r.build(rows[0][:a])
    again = list(rows[0][-1] or ())
    rounds: list[Round] = []
    jobs: dict[Any, Job] = {}
    for row in rows:
        if row[a] is None:  # no open round
            continue
        rnd = round_r.build(row[a:b])
        job_id = row[b]
        if job_id not in jobs:
            jobs[job_id] = job_r.build(row[b:-1])
        rnd.job = jobs[job_id]
        rounds.append(rnd)
    return node, rounds, again
