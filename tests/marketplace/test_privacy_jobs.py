"""Private jobs through the marketplace: the noise set for a target ε, ε tracked after every
round, the stop before the budget is exceeded, and the noise check on uploads."""

from __future__ import annotations

import pytest

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import Task, TaskResult, TaskStatus
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.privacy import epsilon_after, round_plan, rounds_within
from trainer.spec import parse_spec
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db(transaction=True)


def _private(**privacy) -> dict:
    return SMALL_SPEC | {"rounds": {"max_rounds": 6}, "privacy": privacy}


def test_a_target_epsilon_sets_the_noise_for_the_planned_rounds(submit, buyer) -> None:
    job = submit(_private(clip_norm=1.0, epsilon=8.0), tier="platform")
    stored = parse_spec(job["spec"]).privacy
    assert stored.noise_multiplier > 0 and stored.epsilon == 8.0
    plan = round_plan(parse_spec(job["spec"]), shard_rows=1)
    assert 7.8 <= epsilon_after(plan, 6, 1e-5) <= 8.0  # six rounds fit, no more
    assert job["privacy"] == {"mode": "update", "clip_norm": 1.0, "epsilon": 8.0, "delta": 1e-5,
                              "noise_multiplier": stored.noise_multiplier,
                              "epsilon_spent": None}  # fmt: skip


def test_noise_too_small_for_one_round_is_refused(buyer) -> None:
    """Accounted by the worker, which knows the shards' rows (issue 36: the web process
    imports neither torch nor Opacus): the job fails naming the field, nothing held."""
    from marketplace.jobs.preparation import prepare_job
    from marketplace.ledger.selectors import balances

    body = {"spec": _private(clip_norm=1.0, noise_multiplier=0.1, epsilon=1.0),
            "max_price_per_gpu_hour": "1.00", "budget": "10"}  # fmt: skip
    response = buyer.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert prepare_job(job.pk) is None
    job.refresh_from_db()
    assert job.status == "failed" and "privacy.epsilon" in job.error
    assert not job.shards.exists() and balances(job.buyer).held == 0


def test_a_private_job_stops_before_its_budget_and_shows_epsilon(make_agent, submit, buyer) -> None:
    spec = _private(clip_norm=1.0, noise_multiplier=3.0, epsilon=2.0)
    plan = round_plan(parse_spec(spec), shard_rows=1)
    fits = rounds_within(plan, 2.0, 1e-5, limit=6)
    assert 1 <= fits < 6  # the budget, not max_rounds, ends this job
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec, tier="platform")
    run_until_idle(agents)
    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "stopped" and detail["rounds_done"] == fits
    assert "Privacy budget reached" in detail["error"]
    spent = detail["privacy"]["epsilon_spent"]
    assert spent == pytest.approx(epsilon_after(plan, fits, 1e-5)) and spent <= 2.0
    assert epsilon_after(plan, fits + 1, 1e-5) > 2.0
    # no replicas: noisy updates cannot agree; every task ran once
    assert Job.objects.get(pk=job["id"]).rounds.count() == fits


def test_an_upload_without_its_noise_is_rejected(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    submit(_private(clip_norm=1.0, noise_multiplier=3.0), tier="platform")
    task = agent.claim()
    payload, metrics = agent.train(task)
    state, _ = decode_state(payload)
    # what a node that skipped the noise would send: the clipped update alone
    norm = sum(float((t.double() ** 2).sum()) for t in state.values()) ** 0.5
    quiet = {k: t * min(1.0, 1.0 / norm) * 0 for k, t in state.items()}
    # received, then refused by the worker's check: the lease ends with the reason on the task
    assert agent.upload(task["id"], encode_state(quiet), metrics).status_code == 202
    refused = Task.objects.get(pk=task["id"])
    assert refused.status == TaskStatus.PENDING and refused.node_id is None
    assert refused.last_error.startswith("upload refused (privacy)")
    assert "less noise" in refused.last_error
    assert Node.objects.get(pk=agent.node_id).verified_bad == 1
    # the task is queued again; another node's honest, noised update of it is taken
    other = make_agent(kind="platform")
    again = other.claim()
    assert again["id"] == task["id"]
    payload, metrics = other.train(again)
    assert other.upload(again["id"], payload, metrics).status_code == 202
    assert TaskResult.objects.filter(task_id=task["id"]).exists()
