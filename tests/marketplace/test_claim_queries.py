"""What one claim costs the database: a fixed number of queries, however many tasks it
leases (one locked read, one UPDATE for all the leases, one call for their reservations),
and the same answer for every task as a claim of one would give. Query counts, never
timings: a regression guard for the hot path (bench/load_bench.py measures its CPU)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace.nodes.models import Node
from marketplace.rounds.models import ModelCopy, Task
from tests.marketplace.helpers import SMALL_SPEC

SPEC = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 40}}


@pytest.fixture
def trusted(settings):
    """Nodes past their probation and no random replicas: every claim leases exactly what it
    asks for, so two claims' queries compare."""
    settings.GPUFLEX = settings.GPUFLEX | {"REPLICATION_SHARE": 0.0}

    def make(agent):
        Node.objects.filter(pk=agent.node_id).update(
            verified_ok=settings.GPUFLEX["TRUST_AFTER_VERIFIED"]
        )
        return agent

    return make


def _claim(agent, count: int) -> tuple[list[dict], int]:
    with CaptureQueriesContext(connection) as queries:
        response = agent.client.post(f"/api/v1/agent/claim?max={count}")
    assert response.status_code == 200, response.content
    return response.json()["tasks"], len(queries.captured_queries)


def test_a_claim_of_eight_makes_no_more_queries_than_a_claim_of_one(
    make_agent, submit, trusted
) -> None:
    one, eight = trusted(make_agent()), trusted(make_agent())
    submit(SPEC)
    one.claim()  # both nodes' first claims: the same first-call work on each side
    eight.claim()
    tasks_1, queries_1 = _claim(one, 1)
    tasks_8, queries_8 = _claim(eight, 8)
    assert (len(tasks_1), len(tasks_8)) == (1, 8)
    # before: an UPDATE, a re-read for the zone route and more per task leased
    assert queries_8 == queries_1


def test_a_claim_of_eight_stays_within_its_query_budget(
    make_agent, submit, trusted, django_assert_max_num_queries
) -> None:
    agent = trusted(make_agent())
    submit(SPEC)
    agent.claim()
    # the key, the node's presence (2 of them savepoints), the node's row with the open
    # rounds and their jobs (one statement), both locked candidate reads (one statement), one
    # UPDATE for the 8 leases, the job's escrow lock, check and reservations (one call:
    # gpuflex_reserve), the savepoints of the claim's transaction (2): 11 (18 before issue
    # 36's fourth pass), and not one more per task
    with django_assert_max_num_queries(11):
        tasks = agent.client.post("/api/v1/agent/claim?max=8").json()["tasks"]
    assert len(tasks) == 8
    leased = Task.objects.filter(node_id=agent.node_id, status="leased")
    assert leased.count() == 9
    assert all(t.attempts == 1 and t.lease_expires and t.steps for t in leased)


def test_every_task_of_a_claim_carries_the_rounds_model_source(make_agent, submit) -> None:
    agent = make_agent()
    submit(SPEC)
    tasks, _ = _claim(agent, 8)
    assert len(tasks) == 8
    sources = {str(t["model_source"]) for t in tasks}
    assert len(sources) == 1 and tasks[0]["model_source"]["kind"] in ("seed", "full")
    if tasks[0]["model_source"]["kind"] == "seed":  # recorded once: the node holds it
        assert ModelCopy.objects.filter(node_id=agent.node_id).count() == 1
    assert all(t["id"] != u["id"] for i, t in enumerate(tasks) for u in tasks[i + 1 :])


def test_only_a_claim_that_waits_reads_the_work_signal(make_agent, monkeypatch) -> None:
    """The signal is read before a waiting claim's first try (work signalled during it is
    not missed); a claim that does not wait never looks at it."""
    from marketplace.rounds import scheduling

    reads: list[int] = []
    real = scheduling.work_generation
    monkeypatch.setattr(scheduling, "work_generation", lambda: reads.append(1) or real())
    agent = make_agent()  # no job: nothing to lease
    assert agent.client.post("/api/v1/agent/claim?max=8").status_code == 204
    assert reads == []
    assert agent.client.post("/api/v1/agent/claim?max=8&wait=0.2").status_code == 204
    assert reads  # once before the first try, then as the claim waits
