"""The PostgreSQL claim reads its candidates with hand-written SQL
(scheduling._candidates_sql); it must answer exactly what the one queryset rule
(`eligible_tasks` filtered by preference group, read by `_candidates`) answers: the same
tasks, in the same order, for volunteers and platform nodes, tiers, units a node already
holds, shards it caches and rounds its plan keeps it from; and the node's row and open
rounds read in one statement (claim_read) are the ORM's."""

from __future__ import annotations

import pytest
from django.db import connection, connections, transaction
from django.db.models import Q

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.claim_read import node_and_open_rounds
from marketplace.rounds.models import Round, ShardCopy, Task
from marketplace.rounds.scheduling import (
    _candidates,
    _candidates_sql,
    _choose,
    claim_batch,
    eligibility,
    eligible_tasks,
)
from marketplace.rounds.sizing import plan_key
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 12}}


def _both(node_id: int, n: int = 30) -> list[tuple[list[str], list[str]]]:
    node = Node.objects.get(pk=node_id)
    out = []
    for replicas in (False, True):
        group = Q(replica__gt=0) if replicas else Q(replica=0)
        orm = _candidates(eligible_tasks(node).filter(group), node, n, skip_locked=False)
        raw = _candidates_sql(eligibility(node), replicas, n)
        # the live claim's way: the node's row and the open rounds in one statement
        read = _candidates_sql(eligibility(*node_and_open_rounds(node_id)[:2]), replicas, n)
        assert [t.pk for t in read] == [t.pk for t in raw]
        out.append(([str(t.pk) for t in orm], [str(t.pk) for t in raw]))
        assert all(t.round.job_id and t.shard_id == (t.shard.pk if t.shard else None)
                   for t in raw)  # fmt: skip
    return out


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL claim's SQL")
def test_the_claims_sql_answers_what_the_queryset_rule_answers(make_agent, submit) -> None:
    volunteer, other, platform = make_agent(), make_agent(), make_agent(kind="platform")
    submit(SPEC, tier="volunteer")
    submit(SPEC, tier="platform")
    submit(SPEC, tier="hybrid")
    # untrusted volunteers' leases get replicas: units held, replicas pending
    held = claim_batch(Node.objects.get(pk=volunteer.node_id), 5)
    assert held and Task.objects.filter(replica__gt=0).exists()
    # the other volunteer caches two shards (affinity first) and sits out one round
    for task in Task.objects.filter(status="pending", replica=0).order_by("-shard_id")[:2]:
        ShardCopy.objects.create(node_id=other.node_id, shard_id=task.shard_id)
    hybrid = Job.objects.get(tier="hybrid")
    Round.objects.filter(job=hybrid).update(plan={plan_key(other.node_id): {"participate": False}})
    checked = 0
    for agent in (volunteer, other, platform):
        for orm, raw in _both(agent.node_id):
            assert raw == orm
            checked += len(raw)
    assert checked > 30  # the rules left work to compare, in every group that has some


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL claim's read")
def test_the_claims_first_read_is_the_orms(make_agent, submit) -> None:
    agent = make_agent()
    node, rounds, _ = node_and_open_rounds(agent.node_id)
    assert rounds == []  # no open round: the node's row all the same
    submit(SPEC, tier="hybrid")
    submit(SPEC, tier="volunteer")
    node, rounds, _ = node_and_open_rounds(agent.node_id)
    orm = Node.objects.get(pk=agent.node_id)
    fields = [f.attname for f in Node._meta.concrete_fields]
    assert [getattr(node, f) for f in fields] == [getattr(orm, f) for f in fields]
    want = {r.pk: r for r in Round.objects.filter(status="open").select_related("job")}
    assert sorted(r.pk for r in rounds) == sorted(want) and len(rounds) == 2
    for rnd in rounds:
        for model, got, exp in ((Round, rnd, want[rnd.pk]), (Job, rnd.job, want[rnd.pk].job)):
            for f in model._meta.concrete_fields:
                assert getattr(got, f.attname) == getattr(exp, f.attname), f.name
    with pytest.raises(Node.DoesNotExist):
        node_and_open_rounds(10**9)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks are PostgreSQL's")
def test_a_claim_holds_locked_only_what_it_may_lease_and_two_spares(make_agent, submit) -> None:
    """Every candidate a claim reads stays locked until it commits, for every other claim to
    skip; a round's primaries are each their own unit, so a claim of 8 locks 10 of them,
    not 18 (the schedule's concurrent claims skipped the spares' locks)."""
    agent = make_agent()
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 40}})
    node = Node.objects.get(pk=agent.node_id)
    other = connections.create_connection("default")  # another claim's connection
    try:
        with transaction.atomic():
            chosen = _choose(node, 8, eligibility(node), None)
            with other.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM rounds_task WHERE status = 'pending' "
                    "FOR UPDATE SKIP LOCKED) AS free"
                )
                free = cursor.fetchone()[0]  # autocommit: its own locks end with it
        pending = Task.objects.filter(status="pending").count()
    finally:
        other.close()
    assert len(chosen) == 8
    assert pending - free == 10, (pending, free)
