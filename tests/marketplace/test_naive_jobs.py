"""`rounds.mode: naive` on the marketplace: every round is one local step on every shard,
uncompressed, and closes only with all of them."""

from __future__ import annotations

import copy

import pytest

from marketplace.jobs.models import Job
from marketplace.rounds.models import Round
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_naive_job_trains_one_step_a_round_on_every_shard(make_agent, submit) -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    del spec["local"]
    spec["rounds"] = {"mode": "naive", "max_rounds": 2}
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec=spec, tier="platform")
    stored = Job.objects.get(pk=job["id"]).parsed_spec
    assert stored.rounds.mode == "naive" and stored.local.steps == 1
    for number in (1, 2):
        tasks = [(agent, agent.claim()) for agent in agents]
        assert all(task is not None for _, task in tasks)
        for _, task in tasks:
            assert task["round"] == number
            assert task["steps"] == 1 and task["codec"] == "none"
        for i, (agent, task) in enumerate(tasks):
            assert agent.work(task).status_code == 202
            still_open = Round.objects.get(job_id=job["id"], number=number).status == "open"
            assert still_open == (i < len(tasks) - 1)  # it waits for every shard
    assert Job.objects.get(pk=job["id"]).status == "completed"
