"""Bulk assignment: the same eligibility rules as a claim, for many nodes at once."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest

from marketplace.nodes.models import Node
from marketplace.rounds.models import Task
from marketplace.rounds.planning import (
    JobNeeds,
    NodeView,
    PlanRules,
    TaskView,
    plan_assignments,
)
from marketplace.rounds.scheduling import lease_batch
from tests.marketplace.helpers import SMALL_SPEC


def task(i: int, tier: str = "hybrid", replica: int = 0, unit: int | None = None, **kw) -> TaskView:
    """Price, memory and tier are properties of a job; a task differing in them is its own."""
    fields = {"max_price": Decimal("1"), "min_memory_gb": 1.0} | kw
    job = "job" if not kw and tier == "hybrid" else f"job-{i if unit is None else unit}"
    return TaskView(i, job, (1, i if unit is None else unit), replica, tier, JobNeeds(**fields))


def node(i: int, kind: str = "volunteer", price: str = "0.5", memory: float = 8.0) -> NodeView:
    return NodeView(i, kind, Decimal(price), memory, 0.5)


def test_every_task_once_and_slots_respected() -> None:
    tasks = [task(i) for i in range(25)]
    nodes = [node(n) for n in range(10)]
    plan = plan_assignments(tasks, nodes, slots=2)
    assert len(plan) == 20
    assert max(Counter(t for t, _ in plan).values()) == 1
    assert max(Counter(n for _, n in plan).values()) == 2


def test_price_memory_and_tier_rules() -> None:
    tasks = [
        task(0, max_price=Decimal("0.1")),
        task(1, min_memory_gb=64.0),
        task(2, tier="platform"),
        task(3, tier="volunteer"),
        task(4, tier="volunteer", replica=1, unit=3),
    ]
    plan = dict(plan_assignments(tasks, [node(10), node(11, kind="platform")], slots=5))
    assert 0 not in plan and 1 not in plan
    assert plan[2] == 11 and plan[3] == 10 and plan[4] == 11


def test_no_node_gets_two_replicas_of_a_unit() -> None:
    tasks = [task(0, unit=7), task(1, replica=1, unit=7)]
    plan = plan_assignments(tasks, [node(1)], slots=2)
    assert plan == [(0, 1)]
    held = plan_assignments([task(1, replica=1, unit=7)], [node(1)], held=[((1, 7), 1)])
    assert held == []


def test_unreliable_nodes_get_nothing() -> None:
    weak = NodeView(1, "volunteer", Decimal("0.1"), 8.0, 0.05)
    assert plan_assignments([task(0)], [weak], min_reliability=0.2) == []


@pytest.mark.django_db(transaction=True)
def test_lease_batch_leases_each_task_once(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(4)]
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 10}}, tier="platform")
    nodes = list(Node.objects.filter(pk__in=[a.node_id for a in agents]))
    assert lease_batch(nodes, slots=2) == 8
    leased = Task.objects.filter(status="leased")
    assert leased.count() == 8 and all(t.steps and t.node_id for t in leased)
    assert max(Counter(t.node_id for t in leased).values()) == 2
    assert lease_batch(nodes, slots=5) == 2  # only the rest
    # a batch-leased task is the node's own: it can download and upload it
    owned = Task.objects.filter(node_id=agents[0].node_id).first()
    assert agents[0].model(str(owned.pk)).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_lease_batch_without_row_locks_uses_compare_and_set(make_agent, submit, monkeypatch):
    from django.db import connection

    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    agents = [make_agent(kind="platform") for _ in range(2)]
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 5}}, tier="platform")
    taken = agents[0].claim()  # already leased: the batch must not take it again
    nodes = list(Node.objects.filter(pk=agents[1].node_id))
    assert lease_batch(nodes, slots=10) == 4
    assert Task.objects.get(pk=taken["id"]).node_id == agents[0].node_id
    assert Task.objects.filter(node_id=agents[1].node_id, status="leased", attempts=1).count() == 4


def test_a_node_is_given_nothing_of_a_round_it_sits_out() -> None:
    tasks = [task(0), task(1)]  # both of round 1 (TaskView.unit[0])
    nodes = [node(0), node(1)]
    plan = plan_assignments(tasks, nodes, slots=2, rules={0: PlanRules(sat_out={1})})
    assert {n for _, n in plan} == {1} and len(plan) == 2
    other_round = plan_assignments(tasks, nodes, slots=2, rules={0: PlanRules(sat_out={2})})
    assert other_round != plan


def test_a_far_node_is_given_no_replica_of_its_far_round() -> None:
    """A replica's result verifies its round; a node syncing every other round would bring
    it after that round closed. It still takes primaries there, and replicas elsewhere."""
    tasks = [task(0, replica=1), task(1, replica=0)]
    far = {0: PlanRules(far={1})}
    assert plan_assignments(tasks, [node(0)], slots=2, rules=far) == [(1, 0)]
    elsewhere = {0: PlanRules(far={2})}
    assert len(plan_assignments(tasks, [node(0)], slots=2, rules=elsewhere)) == 2


@pytest.mark.django_db(transaction=True)
def test_lease_batch_applies_the_claims_sit_out_rule(make_agent, submit) -> None:
    """One rule for who may take a task: a node the round's plan sits out (poor health) gets
    nothing from the bulk planner either, as a claim would give it nothing."""
    from marketplace.rounds.models import Round
    from marketplace.rounds.sizing import plan_key

    agents = [make_agent(kind="platform") for _ in range(2)]
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 4}}, tier="platform")
    rnd = Round.objects.get()
    entry = {"participate": False, "steps": 1, "batch_size": 32, "codec": "none"}
    rnd.plan = {plan_key(agents[0].node_id): entry}
    rnd.save(update_fields=["plan"])
    assert agents[0].claim() is None  # the live claim's rule
    nodes = list(Node.objects.filter(pk__in=[a.node_id for a in agents]))
    assert lease_batch(nodes, slots=4) == 4
    assert set(Task.objects.filter(status="leased").values_list("node_id", flat=True)) == {
        agents[1].node_id
    }
