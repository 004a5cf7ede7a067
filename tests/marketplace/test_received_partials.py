"""A zone partial received by the web process and not yet checked by the worker
(rounds.zone_checks): its members stay in flight, even should the aggregator go offline; the
check accepts it or refuses it whole, releasing the members with the reason; a check that
never comes is sent again, and after a lease the partial is dropped and its members released.

Inside the test's transaction the check a request sends on commit never runs, so a partial
stays received until the test runs the worker's check itself."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.utils import timezone

from marketplace.nodes import presence
from marketplace.nodes.models import Node, NodeState
from marketplace.rounds.lifecycle import unit_states
from marketplace.rounds.maintenance import reclaim_leases
from marketplace.rounds.models import (
    ReceivedPartial,
    Round,
    Task,
    TaskResult,
    TaskStatus,
    ZonePartial,
)
from marketplace.rounds.zone_checks import check_received_partial
from marketplace.rounds.zones import received_partial_name, recheck_partials
from tests.marketplace.zone_members import put_partial, zone_round


def _task_ids(zr) -> list[str]:
    return [m.task["id"] for m in zr.members]


def test_a_received_partial_is_in_flight_until_checked(make_agent, submit, own_media) -> None:
    zr = zone_round(make_agent, submit)
    data = zr.partial()
    # the hand-off's lease nearly over as the partial comes
    ids = _task_ids(zr)
    Task.objects.filter(pk__in=ids).update(lease_expires=timezone.now() + timedelta(seconds=1))
    first = put_partial(zr.aggregator, data)
    assert first.status_code == 202, first.content
    assert first.json() == {"accepted": True, "checked": False, "members": 2}
    assert put_partial(zr.aggregator, data).status_code == 202  # the retry: the same answer
    received = ReceivedPartial.objects.get()
    assert sorted(received.members) == sorted(_task_ids(zr))
    assert default_storage.exists(received.received_file)
    tasks = Task.objects.filter(pk__in=_task_ids(zr))
    assert {t.status for t in tasks} == {TaskStatus.LEASED}
    # the members wait for the check now: one more lease from the receipt
    soon = timezone.now() + timedelta(seconds=settings.GPUFLEX["LEASE_TIMEOUT_S"] / 2)
    assert all(t.lease_expires > soon for t in tasks)
    rnd = Round.objects.get(pk=zr.round_id)
    assert all(s.in_flight and s.result is None for s in unit_states(rnd))
    # the aggregator goes offline: it delivered, so its members are not orphans
    presence.flush()
    Node.objects.filter(pk=zr.aggregator.node_id).update(
        state=NodeState.OFFLINE, last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert reclaim_leases() == 0
    assert not TaskResult.objects.exists() and not ZonePartial.objects.exists()
    # the check comes: the partial and one result per member, the received bytes gone
    check_received_partial(received.pk)
    stored = ZonePartial.objects.get()
    assert stored.update_hash == received.update_hash and stored.size == len(data)
    assert {t.status for t in tasks.all()} == {TaskStatus.DONE}
    assert set(TaskResult.objects.values_list("partial_id", flat=True)) == {stored.pk}
    assert not ReceivedPartial.objects.exists()
    assert not default_storage.exists(received.received_file)
    check_received_partial(received.pk)  # a redelivered message finds nothing to do
    assert TaskResult.objects.count() == 2
    again = put_partial(zr.aggregator, data)  # the same bytes again: the accepted ones
    assert again.status_code == 200 and again.json()["checked"] is True


def test_a_sum_the_worker_refuses_releases_its_members_with_why(make_agent, submit) -> None:
    zr = zone_round(make_agent, submit)
    # the header and manifest are right, the sum is not: only the worker can see it
    assert put_partial(zr.aggregator, zr.partial(scale=float("nan"))).status_code == 202
    check_received_partial(ReceivedPartial.objects.get().pk)
    assert not ZonePartial.objects.exists() and not TaskResult.objects.exists()
    assert not ReceivedPartial.objects.exists()
    for task in Task.objects.filter(pk__in=_task_ids(zr)):
        assert task.status == TaskStatus.PENDING and task.zone_aggregator_id is None
        # the reason, for the operator and the aggregator's members
        assert task.last_error.startswith("zone partial refused: "), task.last_error
        assert "non_finite" in task.last_error, task.last_error
    # the aggregator's failure is not the members'
    members = Node.objects.filter(pk__in=[m.agent.node_id for m in zr.members])
    assert {n.lost_leases for n in members} == {0}
    # the task goes flat now: the aggregator took its update and would answer its retry
    # of the same bytes as delivered
    again = zr.members[0].agent.claim()
    assert again["id"] in _task_ids(zr) and "zone" not in again


def test_a_partial_naming_members_it_may_not_is_refused_at_once(make_agent, submit) -> None:
    zr = zone_round(make_agent, submit)
    Task.objects.filter(pk=zr.members[1].task["id"]).update(zone_update_hash="0" * 64)
    data = zr.partial()
    refused = put_partial(zr.aggregator, data)
    assert refused.status_code == 409
    assert "update hash is not the one its node handed" in refused.json()["detail"]
    assert not ReceivedPartial.objects.exists()
    # refused before anything was written
    name = received_partial_name(zr.job["id"], hashlib.sha256(data).hexdigest())
    assert not default_storage.exists(name)
    statuses = set(Task.objects.filter(pk__in=_task_ids(zr)).values_list("status", flat=True))
    assert statuses == {TaskStatus.PENDING}


def test_a_check_that_never_comes_is_sent_again_then_the_partial_dropped(
    make_agent, submit, django_capture_on_commit_callbacks
) -> None:
    zr = zone_round(make_agent, submit)
    assert put_partial(zr.aggregator, zr.partial()).status_code == 202
    received = ReceivedPartial.objects.get()
    lease_s = settings.GPUFLEX["LEASE_TIMEOUT_S"]
    assert recheck_partials() == 0  # just received: nothing to do
    # its check sent longer than a stuck period ago: sent again, once a period
    stuck_s = settings.GPUFLEX["STUCK_AGGREGATION_S"]
    earlier = timezone.now() - timedelta(seconds=stuck_s + 1)
    ReceivedPartial.objects.filter(pk=received.pk).update(check_enqueued_at=earlier)
    with django_capture_on_commit_callbacks(execute=False) as sent:
        assert recheck_partials() == 0
        assert recheck_partials() == 0  # the next tick: not again
    assert len(sent) == 1
    assert {t.status for t in Task.objects.filter(pk__in=_task_ids(zr))} == {TaskStatus.LEASED}
    # past a lease: dropped, its members released with the reason
    long_ago = timezone.now() - timedelta(seconds=lease_s + 1)
    ReceivedPartial.objects.filter(pk=received.pk).update(received_at=long_ago)
    assert recheck_partials() == 1
    assert not ReceivedPartial.objects.exists()
    for task in Task.objects.filter(pk__in=_task_ids(zr)):
        assert task.status == TaskStatus.PENDING
        assert task.last_error == "zone partial was received but not checked within a lease"
    assert "zone" not in zr.members[0].agent.claim()  # flat, as after a refusal
    check_received_partial(received.pk)  # its message, delivered at last: nothing to do
    assert not ZonePartial.objects.exists() and not TaskResult.objects.exists()


def test_a_manifest_naming_no_task_at_all_is_refused(make_agent, submit) -> None:
    from trainer.updates import decode_state
    from trainer.zones import Member, PartialSum, encode_partial

    zr = zone_round(make_agent, submit)
    first = zr.members[0]
    partial = PartialSum()
    member = Member("not-a-task-id", str(first.agent.node_id), "0" * 64,
                    first.task["zone"]["samples"], {})  # fmt: skip
    partial.add(decode_state(first.payload)[0], member)
    data = encode_partial(partial, job_id=zr.job["id"], round_id=str(zr.round_id), zone="eu")
    refused = put_partial(zr.aggregator, data)
    assert refused.status_code == 409, refused.content
    assert "task not-a-task-id is not a task of round 1" in refused.json()["detail"]
    assert not ReceivedPartial.objects.exists()
