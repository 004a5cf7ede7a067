"""What an agent learns of an upload the web process answered 202 (received): GET
agent/tasks/<id>/update says checking, accepted, or refused with the reason, to the node that
uploaded and to no other; two checks of one upload end it once; a check whose message was
lost is enqueued again by the tick, once per period."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from marketplace.jobs import files
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import recheck_received_updates, tick
from marketplace.rounds.models import ReceivedUpdate, RefusedUpdate, Task, TaskResult, TaskStatus
from marketplace.rounds.update_checks import check, check_received
from trainer.digest import bytes_hash
from trainer.updates import decode_state, encode_state


@pytest.fixture
def leased(make_agent, submit):
    """A platform job with one task leased to `agent`; returns (agent, task, honest payload)."""
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, _ = agent.train(task)
    return agent, task, payload


def _put(agent, task_id: str, payload: bytes) -> int:
    """The request alone: inside the test's transaction the check it sends on commit never
    runs, so the upload stays received and unchecked."""
    return agent.client.put(
        f"/api/v1/agent/tasks/{task_id}/update", data=payload,
        content_type="application/octet-stream", HTTP_X_GPUFLEX_METRICS=json.dumps({}),
    ).status_code  # fmt: skip


def _outcome(agent, task_id: str):
    return agent.client.get(f"/api/v1/agent/tasks/{task_id}/update")


def _huge(payload: bytes) -> bytes:
    """An update the header check lets through and the worker refuses: its norm."""
    state, _ = decode_state(payload)
    return encode_state({k: v + 1e6 for k, v in state.items()})


def test_an_accepted_upload_reads_checking_then_accepted(leased) -> None:
    agent, task, payload = leased
    assert _put(agent, task["id"], payload) == 202
    first = _outcome(agent, task["id"])
    assert first.status_code == 200, first.content
    assert first.json() == {"status": "checking", "update_hash": bytes_hash(payload), "reason": ""}
    check_received(task["id"])
    assert _outcome(agent, task["id"]).json() == {
        "status": "accepted", "update_hash": bytes_hash(payload), "reason": "",
    }  # fmt: skip


def test_a_refused_upload_reads_refused_with_the_reason(leased) -> None:
    agent, task, payload = leased
    huge = _huge(payload)
    assert _put(agent, task["id"], huge) == 202
    check_received(task["id"])
    assert Task.objects.get(pk=task["id"]).node_id is None  # released: the task forgot it
    body = _outcome(agent, task["id"]).json()
    assert body["status"] == "refused" and body["update_hash"] == bytes_hash(huge)
    assert body["reason"].startswith("upload refused (norm): The update was rejected")
    assert body["reason"] == Task.objects.get(pk=task["id"]).last_error


def test_a_lease_released_before_its_check_reads_refused(leased) -> None:
    """The received upload goes with its lease (a check that never came): the node is told."""
    agent, task, payload = leased
    assert _put(agent, task["id"], payload) == 202
    long_ago = timezone.now() - timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"] + 1)
    Task.objects.filter(pk=task["id"]).update(lease_expires=long_ago)
    ReceivedUpdate.objects.filter(task_id=task["id"]).update(received_at=long_ago)
    assert tick()["reclaimed"] == 1
    body = _outcome(agent, task["id"]).json()
    assert body["status"] == "refused" and body["reason"].startswith("lease lost")


def test_a_node_sees_only_its_own_uploads(leased, make_agent) -> None:
    agent, task, payload = leased
    assert _put(agent, task["id"], _huge(payload)) == 202
    check_received(task["id"])
    other = make_agent(kind="platform")
    response = _outcome(other, task["id"])
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    for task_id in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        assert _outcome(agent, task_id).status_code == 404
    agent.client.credentials()  # no key: no answer at all
    assert _outcome(agent, task["id"]).status_code in (401, 403)


def test_a_task_leased_but_not_uploaded_is_not_found(leased) -> None:
    agent, task, _ = leased
    response = _outcome(agent, task["id"])
    assert response.status_code == 404
    assert "no upload" in response.json()["detail"]


def test_two_checks_of_one_accepted_upload_accept_it_once(leased) -> None:
    """The second check read the row before the first ended it (a redelivered message, or
    one the tick enqueued again, running beside the first): it changes nothing."""
    agent, task, payload = leased
    assert _put(agent, task["id"], payload) == 202
    stale = ReceivedUpdate.objects.select_related("task__round__job", "task__shard", "node").get(
        task_id=task["id"]
    )
    check_received(task["id"])
    files.put(stale.received_file, payload)  # the second had read the bytes before they went
    check(stale)
    check_received(task["id"])
    assert TaskResult.objects.filter(task_id=task["id"]).count() == 1
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.DONE
    assert not RefusedUpdate.objects.exists()  # the second check's Conflict refused nothing
    assert _outcome(agent, task["id"]).json()["status"] == "accepted"


def test_two_checks_of_one_refused_upload_refuse_it_once(leased) -> None:
    agent, task, payload = leased
    huge = _huge(payload)
    assert _put(agent, task["id"], huge) == 202
    stale = ReceivedUpdate.objects.select_related("task__round__job", "task__shard", "node").get(
        task_id=task["id"]
    )
    check(stale)
    files.put(stale.received_file, huge)  # the second had read the bytes before they went
    check(stale)
    assert RefusedUpdate.objects.filter(task_id=task["id"]).count() == 1
    assert Node.objects.get(pk=agent.node_id).lost_leases == 1  # counted once


def test_the_tick_enqueues_a_waiting_check_again_once_per_period(
    leased, django_capture_on_commit_callbacks
) -> None:
    agent, task, payload = leased
    assert _put(agent, task["id"], payload) == 202  # its message: never run (see _put)
    assert recheck_received_updates() == 0  # not waiting long yet
    stuck = timedelta(seconds=settings.GPUFLEX["STUCK_AGGREGATION_S"] + 1)
    ReceivedUpdate.objects.update(check_enqueued_at=timezone.now() - stuck)
    with django_capture_on_commit_callbacks() as sent:
        assert tick()["rechecked"] == 1
        assert tick()["rechecked"] == 0  # enqueued again just now: not on every tick
    assert len(sent) == 1 and ReceivedUpdate.objects.get().checks == 2
    sent[0]()  # the message the tick sent, run by the (eager) worker
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.DONE
    assert _outcome(agent, task["id"]).json()["status"] == "accepted"


def test_two_tasks_sent_the_same_bytes_are_both_checked(make_agent, submit) -> None:
    """A deterministic run gives two nodes the same bytes: one check must not delete the
    file the other's waits in."""
    first, second = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    tasks = [first.claim(), second.claim()]
    payload, _ = first.train(tasks[0])
    for agent, task in zip((first, second), tasks, strict=True):
        assert _put(agent, task["id"], payload) == 202
    for task in tasks:
        check_received(task["id"])
    assert TaskResult.objects.filter(update_hash=bytes_hash(payload)).count() == 2


def test_a_late_second_check_of_a_refused_upload_leaves_the_next_lease_alone(leased) -> None:
    """The node takes the refused task again and uploads good bytes; the refused upload's
    second check, running late, must neither refuse nor accept anything of the new lease."""
    agent, task, payload = leased
    huge = _huge(payload)
    assert _put(agent, task["id"], huge) == 202
    stale = ReceivedUpdate.objects.select_related("task__round__job", "task__shard", "node").get(
        task_id=task["id"]
    )
    check(stale)
    again = agent.claim()
    assert again["id"] == task["id"]  # the same task, back in the queue, leased again
    assert _put(agent, task["id"], payload) == 202
    files.put(stale.received_file, huge)  # the late check had read the bytes before they went
    check(stale)
    assert _outcome(agent, task["id"]).json()["status"] == "checking"
    assert RefusedUpdate.objects.count() == 1
    check_received(task["id"])
    assert _outcome(agent, task["id"]).json()["status"] == "accepted"
