"""Lost work is reassigned: silent nodes, expired leases, overdue rounds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round, Task, TaskResult
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def test_lost_nodes_task_is_reassigned(make_agent, submit) -> None:
    lost, rescuer = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    task = lost.claim()
    payload, metrics = lost.train(task)
    Node.objects.filter(pk=lost.node_id).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert tick()["reclaimed"] == 1
    node = Node.objects.get(pk=lost.node_id)
    assert node.state == "offline" and node.lost_leases == 1
    taken = [rescuer.claim() for _ in range(3)]
    assert task["id"] in [t["id"] for t in taken if t]
    # the lost node's late upload is refused: the task is no longer its own
    assert lost.upload(task["id"], payload, metrics).status_code == 404
    for t in taken:
        assert rescuer.work(t).status_code == 202
    assert Round.objects.get(number=1).status == "done"


def test_expired_lease_is_reassigned(make_agent, submit) -> None:
    slow, fast = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    task = slow.claim()
    slow.heartbeat("working")  # alive, but the lease runs out
    Task.objects.filter(pk=task["id"]).update(lease_expires=timezone.now() - timedelta(seconds=1))
    tick()
    assert Node.objects.get(pk=slow.node_id).state != "offline"
    assert Task.objects.get(pk=task["id"]).status == "pending"
    claimed = {fast.claim()["id"] for _ in range(3)}
    assert task["id"] in claimed


def test_heartbeats_naming_the_task_keep_its_lease(make_agent, submit, settings) -> None:
    """A long task outlives LEASE_TIMEOUT_S while its node heartbeats about it; a node's
    heartbeat never keeps another node's lease, and a silent node still loses its own."""
    worker, other = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    mine, theirs = worker.claim(), other.claim()
    soon = timezone.now() + timedelta(seconds=10)  # well under half of LEASE_TIMEOUT_S left
    Task.objects.filter(pk__in=[mine["id"], theirs["id"]]).update(lease_expires=soon)
    assert worker.heartbeat("working", task_id=mine["id"], progress=0.5).status_code == 200
    assert worker.heartbeat("working", task_id=theirs["id"]).status_code == 200
    assert worker.heartbeat("working", task_id="not-a-task").status_code == 200
    timeout = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    kept = Task.objects.get(pk=mine["id"]).lease_expires
    assert kept > timezone.now() + timedelta(seconds=timeout - 60)
    assert Task.objects.get(pk=theirs["id"]).lease_expires == soon
    # no write while more than half the lease is left: heartbeats stay one UPDATE each
    worker.heartbeat("working", task_id=mine["id"])
    assert Task.objects.get(pk=mine["id"]).lease_expires == kept
    # the silent node's lease runs out and its task goes back to the queue
    Task.objects.filter(pk=theirs["id"]).update(lease_expires=timezone.now() - timedelta(seconds=1))
    tick()
    assert Task.objects.get(pk=theirs["id"]).status == "pending"
    assert Task.objects.get(pk=mine["id"]).status == "leased"


def test_overdue_round_closes_with_what_it_has(make_agent, submit) -> None:
    a, b = make_agent(kind="platform"), make_agent(kind="platform")
    spec = SMALL_SPEC | {"rounds": {"max_rounds": 2, "quorum": 1.0}}
    job = submit(spec, tier="platform")
    assert a.work(a.claim()).status_code == 202
    assert b.work(b.claim()).status_code == 202
    Round.objects.filter(number=1).update(deadline=timezone.now() - timedelta(seconds=1))
    assert tick()["closed"] == 1
    first = Round.objects.get(job_id=job["id"], number=1)
    assert first.status == "done" and first.metrics["participants"] == 2
    assert Round.objects.get(job_id=job["id"], number=2).status == "open"


def test_overdue_round_without_results_waits(make_agent, submit) -> None:
    submit(tier="platform")
    Round.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    assert tick()["closed"] == 0
    rnd = Round.objects.get()
    assert rnd.status == "open" and rnd.deadline > timezone.now()
    assert not Job.objects.get().rounds_done and not TaskResult.objects.exists()


def test_claiming_brings_an_offline_node_back(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    Node.objects.filter(pk=agent.node_id).update(
        state="offline", last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    submit(tier="platform")
    task = agent.claim()
    assert Node.objects.get(pk=agent.node_id).state == "idle"
    tick()  # its fresh lease is not reclaimed: the claim counted as a heartbeat
    assert Task.objects.get(pk=task["id"]).status == "leased"


def test_one_heartbeat_keeps_every_lease_it_names(make_agent, submit) -> None:
    """A node holding several tasks (a claim batch, a prefetch, an upload in flight) keeps all
    of them with one heartbeat's `task_ids`; another node's task among them is left alone."""
    worker, other = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    first, second, theirs = worker.claim(), worker.claim(), other.claim()
    ids = [first["id"], second["id"], theirs["id"]]
    soon = timezone.now() + timedelta(seconds=10)
    Task.objects.filter(pk__in=ids).update(lease_expires=soon)
    reply = worker.heartbeat("working", task_id=first["id"], task_ids=[*ids, "not-a-task"])
    assert reply.status_code == 200
    for pk in ids[:2]:
        assert Task.objects.get(pk=pk).lease_expires > soon
    assert Task.objects.get(pk=theirs["id"]).lease_expires == soon
    too_many = worker.heartbeat("working", task_ids=[first["id"]] * 33)
    assert too_many.status_code == 400 and "task_ids" in too_many.json()["detail"]
