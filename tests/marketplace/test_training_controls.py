"""Learning-rate schedules and early stopping through the marketplace's round lifecycle."""

from __future__ import annotations

import pytest
from django.test import Client

from marketplace.jobs.models import Job
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.schedule import round_lr
from trainer.spec import parse_spec

pytestmark = pytest.mark.django_db(transaction=True)


def test_tasks_train_at_the_rounds_scheduled_rate_and_a_plateau_ends_the_job(
    make_agent, submit, buyer
) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = SMALL_SPEC | {
        "optimizer": {"name": "sgd", "lr": 0.2,
                      "schedule": {"kind": "step", "warmup_rounds": 1, "step_rounds": 1}},
        # no round improves accuracy by more than 1: the job stops after round 1 + patience
        "rounds": {"max_rounds": 10, "early_stopping": {"patience": 2, "min_delta": 1.0}},
    }  # fmt: skip
    job = submit(spec, tier="platform")
    seen: dict[int, set[float]] = {}
    for agent in agents:
        claim = agent.claim

        def recording(wait: float = 0, claim=claim):
            task = claim(wait)
            if task is not None:
                seen.setdefault(task["round"], set()).add(task["lr"])
            return task

        agent.claim = recording
    run_until_idle(agents)

    parsed = parse_spec(job["spec"])
    # every task of a round (JSON keeps a float exact) at that round's rate
    assert seen == {r: {round_lr(parsed, r)} for r in (1, 2, 3)}
    assert [round_lr(parsed, r) for r in (1, 2, 3)] == pytest.approx([0.1, 0.2, 0.1])
    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["rounds_done"] == 3
    assert detail["stop_reason"].startswith(
        "early stopping: accuracy did not improve by more than 1 for 2 rounds"
    )
    assert detail["stop_reason"].endswith("at round 3")
    assert not detail["reached_target"]
    web = Client()
    web.force_login(Job.objects.get(pk=job["id"]).buyer)
    page = web.get(f"/jobs/{job['id']}/")
    assert page.status_code == 200 and detail["stop_reason"] in page.content.decode()
    assert web.get(f"/jobs/{job['id']}/live/").json()["stop_reason"] == detail["stop_reason"]


def test_a_job_that_runs_all_its_rounds_says_so(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    run_until_idle(agents)
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed"
    assert done.stop_reason == "all 2 rounds run (rounds.max_rounds)"
