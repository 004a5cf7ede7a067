"""Exact budgets: every lease reserves its most possible charge in its job's escrow, so a job
never leases work it cannot pay for (docs/money.md, "Budgets")."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from psycopg.pq import TransactionStatus

from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.models import Reservation, ReservationState
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.reservations import _LOCK_CLASS, _lock_key, free_escrow, reserve_all
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import reclaim_leases, tick
from marketplace.rounds.models import Task
from marketplace.rounds.scheduling import lease_batch, nodes_that_may_work_on
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the claim's commit pipeline is PostgreSQL's"
)

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


class _Rollback(Exception):
    pass


def _seen_elsewhere(job: Job) -> tuple[list[Decimal], bool]:
    """(open reservations of `job`, whether its escrow lock is free) read by another
    connection: what every other claim sees now."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT amount FROM ledger_reservation WHERE job_id = %s AND state = 'open'",
                [job.pk],
            )
            amounts = sorted(a for (a,) in cursor.fetchall())
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_CLASS, _lock_key(job.pk)])
            free = cursor.fetchone()[0]  # a session lock: it ends when `other` closes
        return amounts, free
    finally:
        other.close()


@postgres_only
def test_a_claims_reservations_go_out_with_its_commit(make_agent, submit) -> None:
    """With `commit`, in the outermost block, the call and the COMMIT are one round trip:
    when it returns the leases are committed and the job's escrow lock is free for the next
    claim, before the block ends. Short, nothing is committed and the block rolls back."""
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30", spec=SMALL_SPEC)  # one lease of 22 fits, two do not
    node = Node.objects.get(pk=agent.node_id)
    a, b = Task.objects.filter(round__job=job)[:2]
    with pytest.raises(_Rollback), transaction.atomic():
        Task.objects.filter(pk=a.pk).update(claim_key="short")
        assert not reserve_all([(a.pk, job.pk), (b.pk, job.pk)], node, commit=True)
        raise _Rollback  # as the claim does (scheduling._Short)
    assert _seen_elsewhere(job) == ([], True)
    assert Task.objects.get(pk=a.pk).claim_key != "short"
    with transaction.atomic():
        Task.objects.filter(pk=a.pk).update(claim_key="k")
        assert reserve_all([(a.pk, job.pk)], node, commit=True)
        assert _seen_elsewhere(job) == ([LEASE], True)  # committed, the lock released
        assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    assert Task.objects.get(pk=a.pk).claim_key == "k"
    assert _open(job) == [LEASE]


@postgres_only
def test_a_reservation_inside_an_enclosing_block_does_not_commit_it(make_agent, submit) -> None:
    """`commit` only commits a transaction whose end is the claim's own: inside an enclosing
    block (a caller's own transaction) the reservation waits for that block's end."""
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30", spec=SMALL_SPEC)
    node = Node.objects.get(pk=agent.node_id)
    a = Task.objects.filter(round__job=job).first()
    with pytest.raises(_Rollback), transaction.atomic():
        with transaction.atomic():
            assert reserve_all([(a.pk, job.pk)], node, commit=True)
        assert _seen_elsewhere(job) == ([], False)  # not committed; the lock still held
        raise _Rollback
    assert _open(job) == []


def test_reading_who_may_work_on_a_job_is_one_query_however_many_nodes(
    make_agent, submit, django_assert_num_queries
) -> None:
    """Every field the rule reads (node_view) is read with the nodes: a field left deferred
    was a query per node (runtime: 1,000 queries a tick with 1,000 nodes)."""
    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30")
    owner = Node.objects.get(pk=agent.node_id).owner
    for i in range(5):
        Node.objects.create(owner=owner, name=f"more-{i}", price_per_gpu_hour=Decimal("3"),
                            runtime={"plan": "cpu", "torch": "2.13.0"})  # fmt: skip
    with django_assert_num_queries(2):  # the rule's read of every node, then the answer's
        assert agent.node_id in {n.pk for n in nodes_that_may_work_on(job)}


@postgres_only
def test_the_tick_takes_no_lock_on_a_job_it_does_not_stop(make_agent, submit) -> None:
    """A claim's commit checks its reservations' job exists (a foreign key: FOR KEY SHARE on
    the job's row), so a lock on the row held by the tick held up every claim of the job.
    A job with work in flight is judged without it; one the tick stops, under a lock that
    leaves the key alone (FOR NO KEY UPDATE)."""
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    _job(submit, "30")
    assert a.claim() is not None  # in flight: the job is not unaffordable
    taken: list[str] = []

    def spy(execute, sql, params, many, context):
        if "jobs_job" in sql and "FOR" in sql:
            taken.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        assert tick()["unaffordable"] == 0
    assert taken == []
    _job(submit, "10")
    assert b.claim() is None  # 8 free in the first, 10 in this: neither pays for 22
    with connection.execute_wrapper(spy):
        assert tick()["unaffordable"] == 1
    assert taken and all("FOR NO KEY UPDATE" in sql for sql in taken), taken


@postgres_only
def test_a_claim_commits_while_its_job_is_locked_elsewhere(make_agent, submit) -> None:
    """The server's row locks leave keys alone (FOR NO KEY UPDATE): a buyer's pause,
    a round's close or the tick holding the job's row does not hold up the commit of a
    claim, whose reservations' foreign key takes FOR KEY SHARE on that row."""
    from marketplace.jobs import services

    agent = make_agent(kind="platform", price=PRICE)
    job = _job(submit, "30")
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                services._locked(job)
                locked.set()
                done.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        with connection.cursor() as cursor:  # a wait on the row is an error, not a hang
            cursor.execute("SET lock_timeout = '5s'")
        assert agent.claim() is not None
    finally:
        done.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert _open(job) == [LEASE]
