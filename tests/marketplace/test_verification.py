"""Redundancy catches a cheating node; statistics catch updates pointing the wrong way."""

from __future__ import annotations

import pytest
import torch

from marketplace.jobs.aggregation import _statistical_filter
from marketplace.jobs.models import Job, Task, TaskResult
from marketplace.jobs.verification import agree
from marketplace.nodes.models import Node
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def test_cheating_node_is_caught_by_redundancy_and_earns_nothing(make_agent, submit) -> None:
    honest = [make_agent() for _ in range(3)]
    cheater = make_agent()
    verifier = make_agent(kind="platform")
    agents = [cheater, *honest, verifier]  # the cheater claims first
    job = submit(tier="volunteer", spec=SMALL_SPEC | {"rounds": {"max_rounds": 1}})

    run_until_idle(agents, cheaters=[cheater])

    assert Job.objects.get(pk=job["id"]).status == "completed"
    cheats = TaskResult.objects.filter(node_id=cheater.node_id)
    assert cheats.exists()
    assert all(r.verified is False and not r.credited and not r.aggregated for r in cheats)
    # each disputed unit got a third replica, and the honest majority was credited
    for result in cheats:
        unit = TaskResult.objects.filter(
            task__round=result.task.round, task__shard=result.task.shard
        ).exclude(pk=result.pk)
        assert unit.count() == 2 and all(r.verified and r.credited for r in unit)
    node = Node.objects.get(pk=cheater.node_id)
    assert node.verified_bad == cheats.count() and node.reliability < 0.5
    assert cheater.client.get("/api/v1/agent/me").json()["earnings"]["total"] == "0.000000"
    assert all(r.credited for r in TaskResult.objects.exclude(node_id=cheater.node_id)), (
        "honest nodes are paid"
    )


def test_unreliable_node_gets_no_more_work(make_agent, submit) -> None:
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(reliability=0.1)
    submit(tier="volunteer")
    assert agent.claim() is None


def test_trusted_volunteer_is_replicated_only_sometimes(make_agent, submit, settings) -> None:
    settings.GPUFLEX = settings.GPUFLEX | {"REPLICATION_SHARE": 0.0}
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(verified_ok=10, reliability=0.9)
    submit(tier="volunteer")
    agent.claim()
    assert Task.objects.filter(replica__gt=0).count() == 0
    newbie = make_agent()
    newbie.claim()
    assert Task.objects.filter(replica__gt=0).count() == 1


def test_platform_node_takes_replicas_first(make_agent, submit) -> None:
    volunteer, platform = make_agent(), make_agent(kind="platform")
    submit(tier="hybrid")
    volunteer.claim()  # untrusted: its task gets a replica
    task = platform.claim()
    assert Task.objects.get(pk=task["id"]).replica == 1


def test_agreement_tolerance() -> None:
    a = torch.ones(100)
    assert agree(a, a + 1e-6)
    assert not agree(a, torch.zeros(100))
    assert not agree(a, -a)


def test_statistical_filter_drops_an_update_pointing_away() -> None:
    class R:
        def __init__(self, pk: int) -> None:
            self.pk = pk

    good = {"w": torch.ones(10)}
    results = [R(1), R(2), R(3), R(4)]
    deltas = {1: good, 2: good, 3: {"w": torch.ones(10) * 1.1}, 4: {"w": -10 * torch.ones(10)}}
    kept, dropped = _statistical_filter(results, deltas)
    assert [r.pk for r in kept] == [1, 2, 3] and set(dropped) == {4}


def test_unreconciled_dispute_is_not_aggregated_at_the_deadline(make_agent, submit) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from marketplace.jobs.maintenance import tick
    from marketplace.jobs.models import Round

    honest, cheater = make_agent(), make_agent()
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 1}}
    submit(tier="volunteer", spec=spec)
    first = honest.claim()  # untrusted: a replica is made for another node
    replica = cheater.claim()
    assert replica["id"] != first["id"] and replica["seed"] == first["seed"]
    assert honest.work(first).status_code == 201
    assert cheater.work(replica, cheat=True).status_code == 201
    assert Task.objects.filter(replica=2, status="pending").exists()  # a third is wanted
    assert all(r.verified is None for r in TaskResult.objects.all())

    Round.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    assert tick()["closed"] == 0  # neither side of the dispute may be used
    rnd = Round.objects.get()
    assert rnd.status == "open" and rnd.deadline > timezone.now()
    assert not TaskResult.objects.filter(aggregated=True).exists()
