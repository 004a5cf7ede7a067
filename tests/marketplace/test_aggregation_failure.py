"""A round that cannot be aggregated ends its job: failed, with the reason in `error`, the
verified work paid, the rest of the escrow refunded, and nothing ever enqueues it again."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.models import Transaction, TxKind
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from marketplace.rounds import aggregation, tasks
from marketplace.rounds.aggregation import run_aggregation
from marketplace.rounds.maintenance import MAX_AGGREGATION_RESTARTS, tick
from marketplace.rounds.models import Round, Task, TaskResult
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_ledger_jobs import work_all
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db(transaction=True)


class Exploding:
    """A strategy whose aggregation raises, as a bug or an unforeseen input would."""

    proximal_mu = 0.0

    def load_state_dict(self, state: Any) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def aggregate(self, global_state: Any, updates: Any) -> Any:
        raise RuntimeError("the strategy blew up")


def record_enqueued(monkeypatch) -> list[int]:
    """From now on, aggregations that get enqueued are recorded instead of run."""
    calls: list[int] = []
    monkeypatch.setattr(tasks.aggregate_round, "delay", lambda rid: calls.append(rid))
    return calls


def age_aggregations() -> None:
    Round.objects.filter(status="aggregating").update(
        aggregating_since=timezone.now() - timedelta(hours=1)
    )


def assert_ended_and_refunded(buyer, job_id: str, status: str = "failed") -> dict[str, Any]:
    detail = buyer.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["status"] == status and detail["finished_at"]
    costs = detail["costs"]
    assert Decimal(costs["held"]) == 0
    assert Decimal(costs["spent"]) + Decimal(costs["refunded"]) == Decimal(detail["budget"])
    job = Job.objects.get(pk=job_id)
    assert balance(accounts.job_escrow(job)) == 0
    assert balance(accounts.buyer_credit(job.buyer)) == Decimal("1000") - Decimal(costs["spent"])
    assert not Task.objects.filter(round__job=job, status__in=["pending", "leased"]).exists()
    assert not Round.objects.filter(job=job, status__in=["open", "aggregating"]).exists()
    assert reconcile(with_chain=False).ok
    return detail


def assert_never_requeued(job_id: str, monkeypatch) -> None:
    enqueued = record_enqueued(monkeypatch)
    age_aggregations()
    assert tick() == {
        "silos": 0,
        "partials": 0,
        "reclaimed": 0,
        "unaffordable": 0,
        "closed": 0,
        "restarted": 0,
        "rechecked": 0,
        "resumed": 0,
        "pruned": 0,
        "uploads": 0,
        "segment_checks": 0,
    }
    assert enqueued == [] and Job.objects.get(pk=job_id).status in ("failed", "cancelled")


def test_krum_left_with_too_few_updates_fails_the_job(make_agent, submit, buyer, monkeypatch):
    """Krum with f = 0 needs 3 updates; 3 shards pass submission, but the statistical check
    drops a sign-flipped update, leaving 2: the job fails instead of looping."""
    honest = [make_agent(kind="platform") for _ in range(2)]
    flipper = make_agent(kind="platform")
    spec = SMALL_SPEC | {"aggregation": {"strategy": "krum", "byzantine": 0}}
    job = submit(spec, tier="platform")
    for agent in honest:
        assert agent.work(agent.claim()).status_code == 202
    task = flipper.claim()
    payload, metrics = flipper.train(task)
    flipped = {k: -v for k, v in decode_state(payload)[0].items()}
    assert flipper.upload(task["id"], encode_state(flipped), metrics).status_code == 202

    detail = assert_ended_and_refunded(buyer, job["id"])
    assert detail["costs"]["refunded"] == "10.000000"  # platform work is unverified: unpaid
    assert detail["error"].startswith("Round 1 could not be aggregated: Krum needs n > 2f + 2")
    assert "got n=2" in detail["error"] and "unspent budget was returned" in detail["error"]
    rounds = buyer.get(f"/api/v1/jobs/{job['id']}/rounds/").json()["results"]
    assert rounds[0]["status"] == "cancelled" and rounds[0]["metrics"]["error"] == detail["error"]
    assert_never_requeued(job["id"], monkeypatch)


def test_any_aggregation_error_fails_the_job_and_pays_only_verified_work(
    make_agent, submit, buyer, monkeypatch
):
    agents = [make_agent() for _ in range(4)]  # new volunteers: every unit is replicated
    monkeypatch.setattr(aggregation, "build_strategy", lambda spec: Exploding())
    job = submit(tier="volunteer", budget="10")
    work_all(agents)

    detail = assert_ended_and_refunded(buyer, job["id"])
    assert detail["error"] == (
        "Round 1 could not be aggregated: the strategy blew up. The job has ended; its unspent "
        "budget was returned."
    )
    verified = TaskResult.objects.filter(verified=True)
    assert verified.count() == 6 and all(r.credited and not r.aggregated for r in verified)
    charges = Transaction.objects.filter(kind=TxKind.CHARGE)
    assert charges.count() == 6 and Decimal(detail["costs"]["spent"]) > 0
    assert_never_requeued(job["id"], monkeypatch)


def test_transient_errors_are_retried_a_bounded_number_of_times(
    make_agent, submit, buyer, monkeypatch
):
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")

    def database_gone(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(aggregation, "_compute", database_gone)
    # the first attempt runs eagerly on the last upload's commit (a worker runs it in
    # production): the upload is stored, and the error is answered as a logged JSON 500
    statuses = [agent.work(agent.claim()).status_code for agent in agents]
    assert statuses == [202, 202, 500]
    rnd = Round.objects.get(job_id=job["id"], number=1)
    assert rnd.status == "aggregating" and Job.objects.get(pk=job["id"]).status == "running"

    enqueued = record_enqueued(monkeypatch)
    for _ in range(MAX_AGGREGATION_RESTARTS):
        age_aggregations()
        assert tick()["restarted"] == 1  # may pass: enqueued again
        with pytest.raises(OperationalError):
            run_aggregation(rnd.pk)  # what the worker does with it
        assert Job.objects.get(pk=job["id"]).status == "running"
    assert enqueued == [rnd.pk] * MAX_AGGREGATION_RESTARTS

    age_aggregations()
    assert tick()["restarted"] == 0 and len(enqueued) == MAX_AGGREGATION_RESTARTS
    detail = assert_ended_and_refunded(buyer, job["id"])
    attempts = MAX_AGGREGATION_RESTARTS + 1
    assert f"Round 1 did not finish aggregating in {attempts} attempts" in detail["error"]
    assert_never_requeued(job["id"], monkeypatch)


def test_a_cancelled_job_whose_aggregation_fails_stays_cancelled_and_is_refunded(
    make_agent, submit, buyer, monkeypatch
):
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    with monkeypatch.context() as m:  # the aggregation is still queued when the buyer cancels
        m.setattr(tasks.aggregate_round, "delay", lambda rid: None)
        work_all(agents)
    assert buyer.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    escrow = accounts.job_escrow(Job.objects.get(pk=job["id"]))
    assert balance(escrow) == Decimal("10")  # left for the aggregation to settle

    monkeypatch.setattr(aggregation, "build_strategy", lambda spec: Exploding())
    run_aggregation(Round.objects.get(job_id=job["id"], number=1).pk)
    detail = assert_ended_and_refunded(buyer, job["id"], status="cancelled")
    assert detail["error"] == "" and detail["costs"]["refunded"] == "10.000000"


def test_an_overdue_krum_round_waits_for_enough_updates(make_agent, submit, monkeypatch):
    agents = [make_agent(kind="platform") for _ in range(5)]
    spec = SMALL_SPEC | {
        "aggregation": {"strategy": "krum", "byzantine": 1},
        "sharding": {"method": "stratified", "num_shards": 5},
    }
    job = submit(spec, tier="platform")
    for agent in agents[:3]:
        assert agent.work(agent.claim()).status_code == 202
    Round.objects.update(deadline=timezone.now() - timedelta(seconds=1))
    assert tick()["closed"] == 0  # 3 updates: Krum with f = 1 needs 5
    rnd = Round.objects.get(job_id=job["id"], number=1)
    assert rnd.status == "open" and rnd.deadline > timezone.now()

    for agent in agents[3:]:
        assert agent.work(agent.claim()).status_code == 202
    rnd.refresh_from_db()
    assert rnd.status == "done" and rnd.metrics["participants"] == 5
