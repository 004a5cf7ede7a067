"""A claim's escrow check reads its job's floor (ledger.models.EscrowFloor) instead of summing
every open reservation and escrow entry, and only while the floor is sure to be one: exact
after a claim, ignored once an escrow entry is added or when short, dropped by the bulk
lease (docs/money.md, "Budgets")."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection

from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.models import EscrowFloor, TxKind
from marketplace.ledger.posting import post
from marketplace.ledger.reservations import free_escrow
from marketplace.nodes.models import Node
from marketplace.rounds.scheduling import lease_batch
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="gpuflex_reserve's floor"),
]

PRICE = "60"  # a lease reserves 22 (tests/marketplace/test_ledger_reservations.py)
LEASE = Decimal("22.000000")


def _job(submit, budget: str) -> Job:
    data = submit(tier="platform", budget=budget, spec=SMALL_SPEC, max_price_per_gpu_hour="100")
    return Job.objects.get(pk=data["id"])


def test_after_a_claim_the_floor_is_the_exact_free_escrow(make_agent, submit) -> None:
    agents = [make_agent(kind="platform", price=PRICE) for _ in range(3)]
    job = _job(submit, "100")
    for agent in agents:
        assert agent.claim() is not None
        floor = EscrowFloor.objects.get(job=job)
        assert floor.free == free_escrow([job.pk])[job.pk]
    assert floor.free == Decimal("100") - 3 * LEASE


def test_a_floor_is_read_while_the_job_has_the_same_escrow_entries(make_agent, submit) -> None:
    """Shown by a floor made too high on purpose: a claim believes it (it does not sum),
    which is why only gpuflex_reserve may write one."""
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    job = _job(submit, "30")  # one lease of 22
    assert a.claim() is not None
    EscrowFloor.objects.filter(job=job).update(free=Decimal("1000"))
    assert b.claim() is not None  # on the floor's word: 8 free would not cover it


def test_a_new_escrow_entry_makes_the_floor_count_for_nothing(make_agent, submit, buyer):
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    job = _job(submit, "30")
    assert a.claim() is not None
    EscrowFloor.objects.filter(job=job).update(free=Decimal("1000"))
    # any entry on the job's escrow (here a refund of 1 to the buyer) voids the floor
    post(f"test-refund:{job.pk}", TxKind.RELEASE,
         [(accounts.job_escrow(job), Decimal("-1")), (accounts.buyer_credit(job.buyer_id),
                                                      Decimal("1"))], job=job)  # fmt: skip
    assert b.claim() is None  # 7 free, summed exactly
    assert free_escrow([job.pk])[job.pk] == Decimal("7")


def test_a_floor_short_of_the_claim_is_checked_exactly(make_agent, submit) -> None:
    a, b = (make_agent(kind="platform", price=PRICE) for _ in range(2))
    job = _job(submit, "100")
    assert a.claim() is not None
    EscrowFloor.objects.filter(job=job).update(free=Decimal("0"))  # lower: always safe
    assert b.claim() is not None  # 78 free, summed
    assert EscrowFloor.objects.get(job=job).free == Decimal("100") - 2 * LEASE


def test_the_bulk_lease_drops_the_floors_of_the_jobs_it_reserves_in(make_agent, submit):
    agents = [make_agent(kind="platform", price=PRICE) for _ in range(3)]
    job = _job(submit, "100")
    assert agents[0].claim() is not None
    assert EscrowFloor.objects.filter(job=job).exists()
    assert lease_batch(list(Node.objects.filter(pk__in=[a.node_id for a in agents[1:]]))) == 2
    assert not EscrowFloor.objects.filter(job=job).exists()
