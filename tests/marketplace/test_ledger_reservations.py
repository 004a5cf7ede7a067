"""Exact budgets: every lease reserves its most possible charge in its job's escrow, so a job
never leases work it cannot pay for (docs/money.md, "Budgets")."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.models import Reservation, ReservationState
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.reservations import free_escrow, reserve_all
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import reclaim_leases, tick
from marketplace.rounds.models import Task
from marketplace.rounds.scheduling import lease_batch
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

# 60 per reference GPU-hour on an 80 TFLOP/s node (speed 4): a lease of up to 300 s with the
# full 10 % bonus reserves 60 x 300 x 4 / 3600 x 1.1 = 22; an upload of 2 s, 0.146666
PRICE = "60"
LEASE = Decimal("22.000000")
UPLOADED = Decimal("0.146666")  # 0.133333 + its 10 % bonus, each rounded
ONE_ROUND = SMALL_SPEC | {"rounds": {"max_rounds": 1}}


def _job(submit, budget: str, spec=ONE_ROUND) -> Job:
    data = submit(tier="platform", budget=budget, spec=spec, max_price_per_gpu_hour="100")
    return Job.objects.get(pk=data["id"])


def _open(job: Job) -> list[Decimal]:
    return sorted(
        Reservation.objects.filter(job=job, state=ReservationState.OPEN).values_list(
            "amount", flat=True
        )
    )


def test_a_lease_reserves_its_most_possible_charge_and_an_upload_shrinks_it(make_agent, submit):
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    job = _job(submit, "30")
    first = a.claim()
    assert first is not None and _open(job) == [LEASE]
    assert free_escrow([job.pk])[job.pk] == Decimal("8")
    assert b.claim() is None  # 8 free cannot pay for another lease of up to 22
    Task.objects.filter(pk=first["id"]).update(leased_at=timezone.now() - timedelta(seconds=60))
    assert a.work(first).status_code == 202
    assert _open(job) == [UPLOADED]  # at most 2 s of it can be charged now
    assert b.claim() is not None  # so the rest is free again
    assert _open(job) == [UPLOADED, LEASE]
    assert reconcile(with_chain=False).ok


def test_a_lost_lease_releases_its_reservation(make_agent, submit) -> None:
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30")
    task = agent.claim()
    Task.objects.filter(pk=task["id"]).update(lease_expires=timezone.now() - timedelta(seconds=1))
    assert reclaim_leases() == 1
    assert _open(job) == [] and free_escrow([job.pk])[job.pk] == Decimal("30")
    released = Reservation.objects.get(task_id=task["id"])
    assert released.state == ReservationState.RELEASED and released.closed_at is not None


def test_charges_convert_reservations_and_are_never_cut(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform", price=PRICE) for _ in range(3)]
    job = _job(submit, "22.5")  # one lease at a time; three of them over the round
    from tests.marketplace.test_ledger_jobs import work_all

    assert work_all(agents) == 3
    costs = buyer.get(f"/api/v1/jobs/{job.pk}/").json()["costs"]
    assert costs["charges"] == 3 and costs["shortfall"] == "0.000000"
    states = set(Reservation.objects.filter(job=job).values_list("state", flat=True))
    assert states == {ReservationState.CONVERTED}
    assert balance(accounts.job_escrow(job)) == 0  # completed: the rest went back
    assert reconcile(with_chain=False).ok


def test_a_job_that_cannot_afford_one_task_stops_on_the_tick(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "10")
    assert agent.claim() is None  # 10 < 22: no lease, nothing run that could not be paid
    assert tick()["unaffordable"] == 1
    detail = buyer.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["status"] == "stopped"
    assert "would reserve at least 22.000000" in detail["error"], detail["error"]
    assert detail["costs"]["refunded"] == "10.000000"
    assert tick()["unaffordable"] == 0
    assert reconcile(with_chain=False).ok


def test_a_job_with_work_in_flight_is_not_stopped(make_agent, submit) -> None:
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    job = _job(submit, "30")
    assert a.claim() is not None and b.claim() is None
    # its in-flight lease may still free escrow when it is settled: the job waits
    assert tick()["unaffordable"] == 0
    assert Job.objects.get(pk=job.pk).status == "running"


def test_cancelling_a_job_releases_its_reservations(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30")
    agent.claim()
    assert buyer.post(f"/api/v1/jobs/{job.pk}/cancel").status_code == 200
    assert _open(job) == []
    assert balance(accounts.buyer_credit(job.buyer)) == Decimal("1000")
    assert reconcile(with_chain=False).ok


def test_bulk_leasing_reserves_only_what_the_free_escrow_covers(make_agent, submit) -> None:
    agents = [make_agent(kind="platform", price=PRICE) for _ in range(3)]
    job = _job(submit, "50")  # two leases of 22, not three
    nodes = list(Node.objects.filter(pk__in=[a.node_id for a in agents]))
    assert lease_batch(nodes) == 2
    assert _open(job) == [LEASE, LEASE]
    leased = Task.objects.filter(round__job=job, status="leased")
    assert set(leased.values_list("pk", flat=True)) == set(
        Reservation.objects.filter(job=job).values_list("task_id", flat=True)
    )
    assert lease_batch(nodes) == 0  # 6 free: nothing more
    assert free_escrow([job.pk])[job.pk] == Decimal("6")


def test_a_stale_open_reservation_is_released_never_doubled(make_agent, submit) -> None:
    """A lease put back to pending by code that did not release its reservation: the next
    lease of the task releases the stale one in the same statement that writes its own."""
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "100")
    task = agent.claim()
    Task.objects.filter(pk=task["id"]).update(status="pending", node=None)  # not released
    assert _open(job) == [LEASE]
    again = agent.claim()
    assert again is not None and again["id"] == task["id"]
    rows = Reservation.objects.filter(task_id=task["id"])
    assert sorted(r.state for r in rows) == [ReservationState.OPEN, ReservationState.RELEASED]
    assert _open(job) == [LEASE]


def test_a_claims_reservations_are_all_or_none(make_agent, submit) -> None:
    """reserve_all (PostgreSQL: one gpuflex_reserve call) writes every lease's reservation
    when the job's free escrow covers them all, and none when it covers only some."""
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30", spec=SMALL_SPEC)  # one lease of 22 fits, two do not
    node = Node.objects.get(pk=agent.node_id)
    a, b = Task.objects.filter(round__job=job)[:2]
    with transaction.atomic():
        assert not reserve_all([(a.pk, job.pk), (b.pk, job.pk)], node)
    assert _open(job) == []
    with transaction.atomic():
        assert reserve_all([(a.pk, job.pk)], node)
    assert _open(job) == [LEASE] and free_escrow([job.pk])[job.pk] == Decimal("8")
