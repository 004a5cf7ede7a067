"""An update received by the web process and not yet checked by the worker
(rounds.update_checks): in flight for the round, never a result, its lease not reclaimed as
lost while the check is due; a retry of the same bytes is answered as the first."""

from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from marketplace.rounds.lifecycle import unit_states
from marketplace.rounds.maintenance import reclaim_leases
from marketplace.rounds.models import ReceivedUpdate, Round, Task, TaskResult, TaskStatus
from marketplace.rounds.update_checks import check_received


def _put(agent, task_id: str, payload: bytes, metrics: dict) -> int:
    """The request alone: inside the test's transaction the check it sends on commit never
    runs, so the upload stays received and unchecked."""
    return agent.client.put(
        f"/api/v1/agent/tasks/{task_id}/update", data=payload,
        content_type="application/octet-stream", HTTP_X_GPUFLEX_METRICS=json.dumps(metrics),
    ).status_code  # fmt: skip


def test_a_received_update_is_in_flight_until_checked(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, metrics = agent.train(task)
    assert _put(agent, task["id"], payload, metrics) == 202
    assert _put(agent, task["id"], payload, metrics) == 202  # the retry: the same answer
    assert _put(agent, task["id"], payload[:-4] + b"\0\0\0\0", metrics) == 409
    # its lease runs out while the check waits: the task is neither lost nor a result
    Task.objects.filter(pk=task["id"]).update(lease_expires=timezone.now() - timedelta(1))
    assert reclaim_leases() == 0
    rnd = Round.objects.get(tasks__pk=task["id"])
    mine = next(s for s in unit_states(rnd) if s.unit == Task.objects.get(pk=task["id"]).unit)
    assert mine.in_flight and mine.result is None
    assert not TaskResult.objects.exists()
    # the check comes: a result, and the same bytes again are the accepted ones
    check_received(task["id"])
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.DONE
    assert _put(agent, task["id"], payload, metrics) == 200


def test_a_check_that_never_comes_ends_the_lease_after_a_lease_time(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, metrics = agent.train(task)
    assert _put(agent, task["id"], payload, metrics) == 202
    long_ago = timezone.now() - timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"] + 1)
    Task.objects.filter(pk=task["id"]).update(lease_expires=long_ago)
    ReceivedUpdate.objects.filter(task_id=task["id"]).update(received_at=long_ago)
    assert reclaim_leases() == 1
    released = Task.objects.get(pk=task["id"])
    assert released.status == TaskStatus.PENDING and released.node_id is None
    assert not ReceivedUpdate.objects.exists()
    check_received(task["id"])  # its message, delivered at last, finds nothing to do
    assert not TaskResult.objects.exists()
