"""Money through a job's life: hold on submit, charges for verified work only, fees, the
cost of redundancy, refunds on completion and cancellation, and stopping on budget."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.models import Transaction, TxKind
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.ledger.services import charge_result
from marketplace.rounds.aggregation import run_aggregation
from marketplace.rounds.models import Round, Task, TaskResult
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def work_all(agents, cheaters=(), lease_s: float = 60.0) -> int:
    """Agents work until nothing is left; each lease is backdated by `lease_s` so the server's
    clock allows the agent's reported compute time (2 s) to be billed."""
    done = 0
    for _ in range(200):
        worked = False
        for agent in agents:
            task = agent.claim()
            if task is None:
                continue
            Task.objects.filter(pk=task["id"]).update(
                leased_at=timezone.now() - timedelta(seconds=lease_s)
            )
            response = agent.work(task, cheat=agent in cheaters)
            assert response.status_code == 202, response.content
            worked, done = True, done + 1
        if not worked:
            return done
    raise AssertionError("work never ran out")


def buyer_credit(job_id: str) -> Decimal:
    return balance(accounts.buyer_credit(Job.objects.get(pk=job_id).buyer))


def test_submit_holds_the_budget_and_refuses_more_than_the_credit(buyer, submit) -> None:
    job = submit(budget="25")
    assert buyer_credit(job["id"]) == Decimal("975")  # 1000 granted in the fixture
    assert job["costs"]["held"] == "25.000000" and job["costs"]["spent"] == "0.000000"

    response = buyer.post(
        "/api/v1/jobs/",
        {"spec": SMALL_SPEC, "max_price_per_gpu_hour": "1", "budget": "976"},
        format="json",
    )
    assert response.status_code == 402
    assert response.json()["error"] == "insufficient_credit"
    assert "976" in response.json()["detail"] and "975" in response.json()["detail"]
    assert Job.objects.count() == 1
    assert reconcile(with_chain=False).ok


def test_completed_job_pays_verified_work_and_refunds_the_rest(make_agent, submit, buyer):
    agents = [make_agent(kind="platform", price="0.60") for _ in range(3)]
    job = submit(tier="platform", budget="10")
    assert work_all(agents) == 6

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed"
    costs = {k: Decimal(v) if isinstance(v, str) else v for k, v in detail["costs"].items()}
    assert costs["charges"] == 6 == TaskResult.objects.filter(credited=True).count()
    # 2 s at 0.60 per reference GPU-hour on an 80 TFLOP/s GPU (4x the reference), + bonus
    base = Decimal("0.60") * 2 * 4 / 3600
    assert Decimal("5.9") * base < costs["spent"] <= Decimal("6.6") * base
    assert costs["platform_fee"] + costs["provider_share"] == costs["spent"]
    assert abs(costs["platform_fee"] - costs["spent"] / 10) <= Decimal("0.000006")
    assert costs["held"] == 0 and costs["refunded"] == Decimal("10") - costs["spent"]
    assert buyer_credit(job["id"]) == Decimal("1000") - costs["spent"]
    earned = sum(
        Decimal(a.client.get("/api/v1/agent/me").json()["earnings"]["total"]) for a in agents
    )
    assert earned == costs["provider_share"]
    assert reconcile(with_chain=False).ok


def test_rejected_work_is_never_paid_and_redundancy_is_shown(make_agent, submit, buyer):
    honest = [make_agent() for _ in range(3)]
    cheater, verifier = make_agent(), make_agent(kind="platform")
    job = submit(tier="volunteer", budget="10", spec=SMALL_SPEC | {"rounds": {"max_rounds": 1}})
    work_all([cheater, *honest, verifier], cheaters=[cheater])

    cheats = TaskResult.objects.filter(node_id=cheater.node_id)
    assert cheats.exists() and not Transaction.objects.filter(task_result__in=cheats).exists()
    paid = Transaction.objects.filter(kind=TxKind.CHARGE)
    assert paid.count() == TaskResult.objects.filter(credited=True).count() > 0
    costs = buyer.get(f"/api/v1/jobs/{job['id']}/").json()["costs"]
    assert Decimal(costs["redundancy_cost"]) > 0  # volunteers' work was replicated
    assert Decimal(costs["redundancy_cost"]) < Decimal(costs["spent"])
    assert reconcile(with_chain=False).ok


def test_cancel_returns_the_unspent_budget(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform", budget="10")
    task = agent.claim()
    agent.work(task)
    response = buyer.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200
    costs = buyer.get(f"/api/v1/jobs/{job['id']}/").json()["costs"]
    assert costs["held"] == "0.000000" and costs["refunded"] == "10.000000"
    assert buyer_credit(job["id"]) == Decimal("1000")
    assert reconcile(with_chain=False).ok


def test_a_job_that_cannot_afford_another_round_stops_and_says_why(make_agent, submit, buyer):
    agents = [make_agent(kind="platform", price="60") for _ in range(3)]
    # a lease reserves 60 x 300 s x 4 (80 TFLOP/s) / 3600 x 1.1 = 22; each upload of 2 s
    # shrinks its reservation to 60 x 2 x 4 / 3600 x 1.1 = 0.146666 (docs/money.md): a
    # budget of 22.3 leases one task at a time, and after round 1 (about 0.4 spent) its free
    # escrow is short of the next 22
    spec = SMALL_SPEC | {"rounds": {"max_rounds": 5}}
    job = submit(tier="platform", budget="22.3", spec=spec, max_price_per_gpu_hour="100")
    work_all(agents)
    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "stopped" and detail["rounds_done"] == 1
    assert "budget" in detail["error"] and "round 1" in detail["error"]
    assert "would reserve at least 22.000000" in detail["error"], detail["error"]
    costs = detail["costs"]
    assert costs["charges"] == 3
    assert Decimal(costs["spent"]) + Decimal(costs["refunded"]) == Decimal("22.3")
    assert costs["shortfall"] == "0.000000"
    assert reconcile(with_chain=False).ok


def test_a_redelivered_aggregation_or_charge_pays_nothing_twice(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    submit(tier="platform", budget="10")
    work_all(agents)
    before = Transaction.objects.filter(kind=TxKind.CHARGE).count()
    # a worker died after the checkpoint, before its commit: the round is aggregated again
    last = Round.objects.order_by("number").last()
    Round.objects.filter(pk=last.pk).update(status="aggregating")
    run_aggregation(last.pk)  # reuses the checkpoint and settles again
    run_aggregation(last.pk)  # a duplicate delivery: the round is done, nothing happens
    for result in TaskResult.objects.filter(credited=True):
        charge_result(result)
    assert Transaction.objects.filter(kind=TxKind.CHARGE).count() == before
    assert reconcile(with_chain=False).ok
