"""Concurrent claims never lease one task twice (threads hammering PostgreSQL)."""

from __future__ import annotations

import threading
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection

from marketplace.jobs.models import Job
from marketplace.ledger.models import Reservation, ReservationState
from marketplace.ledger.reservations import free_escrow
from marketplace.nodes.models import Node
from marketplace.rounds.models import Task
from marketplace.rounds.scheduling import claim_batch
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8


def hammer(
    node_ids: list[int], claimed: list[tuple[int, str]], errors: list[BaseException], batch: int
) -> None:
    barrier = threading.Barrier(len(node_ids))

    def run(node_id: int) -> None:
        try:
            node = Node.objects.get(pk=node_id)
            barrier.wait()
            while tasks := claim_batch(node, batch):
                claimed.extend((node_id, str(task.pk)) for task in tasks)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in node_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize(("kind", "batch"), [("platform", 1), ("volunteer", 1), ("volunteer", 5)])
def test_no_task_is_leased_twice(make_agent, submit, kind: str, batch: int) -> None:
    agents = [make_agent(kind=kind) for _ in range(THREADS)]
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 60}}
    submit(spec, tier=kind if kind == "platform" else "volunteer")
    claimed: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    hammer([a.node_id for a in agents], claimed, errors, batch)
    assert not errors, errors
    counts = Counter(task_id for _, task_id in claimed)
    assert counts and max(counts.values()) == 1, "a task was leased twice"
    leased = Task.objects.filter(status="leased")
    assert leased.count() == len(claimed)
    assert {str(t.pk): t.node_id for t in leased} == dict((t, n) for n, t in claimed)
    # replicas of one unit always sit on different nodes
    units = Counter((t.round_id, t.shard_id, t.node_id) for t in leased)
    assert max(units.values()) == 1
    if kind == "volunteer":  # new volunteers are untrusted: replicas were made and taken
        assert Task.objects.filter(replica__gt=0, status="leased").exists()


# 60 per reference GPU-hour on an 80 TFLOP/s node: a lease reserves 22 (see
# test_ledger_reservations); a budget of 200 pays for nine leases, and 2 stays free
PRICE = "60"
LEASE = Decimal("22.000000")


def test_concurrent_claims_on_a_tight_budget_reserve_exactly_what_the_escrow_covers(
    make_agent, submit
) -> None:
    """Claims lease first and reserve the job's escrow last (scheduling._claim_locked): when
    the escrow runs short under eight racing claimers, the short claims are redone the
    careful way, so the job leases exactly what it can pay for, every lease has its one
    open reservation, and no task is leased twice."""
    agents = [make_agent(kind="platform", price=PRICE) for _ in range(THREADS)]
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 60},
                         "rounds": {"max_rounds": 1}}  # fmt: skip
    data = submit(spec, tier="platform", budget="200", max_price_per_gpu_hour="100")
    job = Job.objects.get(pk=data["id"])
    claimed: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    hammer([a.node_id for a in agents], claimed, errors, 2)
    assert not errors, errors
    counts = Counter(task_id for _, task_id in claimed)
    assert len(counts) == 9 and max(counts.values()) == 1
    leased = set(
        str(pk)
        for pk in Task.objects.filter(round__job=job, status="leased").values_list("pk", flat=True)
    )
    assert leased == set(counts)
    open_ = Reservation.objects.filter(job=job, state=ReservationState.OPEN)
    assert sorted(str(t) for t in open_.values_list("task_id", flat=True)) == sorted(leased)
    assert set(open_.values_list("amount", flat=True)) == {LEASE}
    assert free_escrow([job.pk])[job.pk] == Decimal("2")
