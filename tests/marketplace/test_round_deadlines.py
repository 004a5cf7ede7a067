"""Round deadlines on the marketplace (trainer.round_lifecycle): an adaptive round applies
its plan's deadline and quorum, and an under-filled round waits a bounded number of
deadlines, then its job fails saying why."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.rounds.maintenance import close_overdue_rounds
from marketplace.rounds.models import Round, Task
from tests.marketplace.helpers import SMALL_SPEC
from trainer import round_lifecycle as rl

pytestmark = pytest.mark.django_db(transaction=True)

BENCHMARK = {"train_samples_per_s": {"mlp": 64000}}


def _due_now(rnd: Round) -> None:
    Round.objects.filter(pk=rnd.pk).update(deadline=timezone.now() - timedelta(seconds=1))


def test_an_underfilled_round_waits_a_bounded_number_of_deadlines(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    rnd = Round.objects.get(job_id=job["id"], number=1)
    assert rnd.deadline_s == 900.0 and rnd.plan_quorum is None  # unplanned: the default
    assert agent.claim() is not None  # leased, and never worked: nothing to aggregate
    for passed in range(1, rl.MAX_DEADLINES):
        _due_now(rnd)
        assert close_overdue_rounds() == 0
        rnd.refresh_from_db()
        assert rnd.status == "open" and rnd.deadlines_passed == passed
        # pushed back by one deadline period, not more
        assert rnd.deadline > timezone.now() + timedelta(seconds=rnd.deadline_s - 60)
    # its deadlines spent, but the lease is alive (a GPU node slow to start its first task,
    # seen on a lent H200): the round waits on for it rather than fail the job mid-task
    _due_now(rnd)
    assert close_overdue_rounds() == 0
    rnd.refresh_from_db()
    assert rnd.status == "open" and rnd.deadlines_passed == rl.MAX_DEADLINES
    # the lease runs out (its node silent, or past its expiry): nothing in flight, it gives up
    Task.objects.filter(round=rnd).update(lease_expires=timezone.now() - timedelta(seconds=1))
    _due_now(rnd)
    close_overdue_rounds()
    rnd.refresh_from_db()
    assert rnd.status == "cancelled"
    failed = Job.objects.get(pk=job["id"])
    assert failed.status == "failed"
    assert f"after {rl.MAX_DEADLINES} deadlines" in failed.error


def test_a_round_past_its_deadline_closes_with_what_it_has(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    rnd = Round.objects.get(job_id=job["id"], number=1)
    task = agent.claim()
    assert agent.work(task).status_code == 202  # one of three shards in
    assert Round.objects.get(pk=rnd.pk).status == "open"  # quorum 1.0: not yet
    _due_now(rnd)
    assert close_overdue_rounds() == 1
    assert Round.objects.get(pk=rnd.pk).status != "open"


def test_an_adaptive_round_applies_its_plans_deadline_and_quorum(make_agent, submit) -> None:
    for _ in range(2):
        make_agent(kind="platform", benchmark=BENCHMARK)
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    job = submit(spec=spec, tier="platform")
    rnd = Round.objects.get(job_id=job["id"], number=1)
    assert rnd.plan and rnd.plan_quorum == 2  # the policy's: both planned nodes
    assert 0 < rnd.deadline_s < 900.0  # the plan's, not the default
    period = (rnd.deadline - rnd.opened_at).total_seconds()
    assert period == pytest.approx(rnd.deadline_s, abs=5.0)
