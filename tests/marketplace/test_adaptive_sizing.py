"""Jobs that enable adaptation are sized by trainer.adapt.plan_round, codecs included."""

from __future__ import annotations

import copy

import pytest

from marketplace.jobs.models import Job, Task
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _adaptive_spec(codec: str) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    spec["compression"] = {"codec": codec}
    return spec


def _agents(make_agent):
    fast = make_agent(kind="platform", benchmark={"train_samples_per_s": {"mlp": 64000}})
    slow = make_agent(kind="platform", benchmark={"train_samples_per_s": {"mlp": 16000}})
    return fast, slow


def test_faster_nodes_get_more_steps_and_the_spec_codec(make_agent, submit) -> None:
    fast, slow = _agents(make_agent)
    submit(spec=_adaptive_spec("int8"), tier="platform")
    fast_task, slow_task = fast.claim(), slow.claim()
    assert fast_task["codec"] == slow_task["codec"] == "int8"
    # 4x the throughput: about 4x the steps, so both finish together
    assert fast_task["steps"] == pytest.approx(4 * slow_task["steps"], rel=0.2)
    assert fast_task["steps"] <= 400


def test_a_job_with_compressed_updates_runs_to_completion(make_agent, submit) -> None:
    agents = _agents(make_agent)
    job = submit(spec=_adaptive_spec("int4"), tier="platform")
    assert run_until_idle(agents) == 6
    stored = Job.objects.get(pk=job["id"])
    assert stored.status == "completed" and stored.rounds_done == 2
    assert set(Task.objects.filter(round__job=stored).values_list("codec", flat=True)) == {"int4"}


def test_plain_jobs_keep_equal_work(make_agent, submit) -> None:
    fast, slow = _agents(make_agent)
    submit(tier="platform")
    a, b = fast.claim(), slow.claim()
    assert a["steps"] == b["steps"] == SMALL_SPEC["local"]["steps"]
    assert a["codec"] == "none"
