"""Jobs that enable adaptation are sized by trainer.adapt.plan_round, codecs included."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round, Task
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _adaptive_spec(codec: str) -> dict:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    spec["compression"] = {"codec": codec}
    return spec


def _agents(make_agent):
    # a node's speed is its one figure (nodes.selectors.speed_of): its fp32 benchmark until
    # its tasks are observed; the reference-model throughput prices the job's work per sample
    fast = make_agent(kind="platform", benchmark=FAST)
    slow = make_agent(kind="platform", benchmark=SLOW)
    return fast, slow


FAST = {"fp32_tflops": 80.0, "train_samples_per_s": {"mlp": 64000}}
SLOW = {"fp32_tflops": 20.0, "train_samples_per_s": {"mlp": 16000}}


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


def test_the_round_plan_sits_out_an_unhealthy_node_until_the_round_would_stall(
    make_agent, submit
) -> None:
    """plan_round decides once per round, at its opening, and the marketplace carries it out:
    planned work for each node, and no task for a node the policy excludes (its tier kept on
    the job for re-admission hysteresis), unless the round would otherwise stall."""
    fast, slow = _agents(make_agent)
    bad = make_agent(kind="platform", benchmark=FAST)
    Node.objects.filter(pk=bad.node_id).update(verified_bad=5)  # its updates kept failing
    job = submit(spec=_adaptive_spec("none"), tier="platform")
    first = Round.objects.get(job_id=job["id"], number=1)
    assert first.plan[f"n{bad.node_id}"]["participate"] is False
    assert Job.objects.get(pk=job["id"]).policy_tiers[str(bad.node_id)] == "temporarily_excluded"
    assert bad.claim() is None  # sat out, though tasks are pending
    task = fast.claim()
    assert task["steps"] == first.plan[f"n{fast.node_id}"]["steps"]
    assert slow.claim()["steps"] == first.plan[f"n{slow.node_id}"]["steps"] < task["steps"]
    # past the deadline with nothing to aggregate: anyone may take the work still pending
    Round.objects.filter(pk=first.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    tick()
    assert Round.objects.get(pk=first.pk).plan == {}
    assert bad.claim() is not None


def test_the_next_round_is_sized_on_the_step_time_nodes_showed(
    make_agent, submit, settings
) -> None:
    """Three nodes with one benchmark get equal work; once their tasks show that one steps
    4x as fast as the others, its speed figure (the benchmark's weight as a prior set to
    nothing here) and so the next round's plan give it about 4x the steps."""
    settings.GPUFLEX = settings.GPUFLEX | {"SPEED_PRIOR_TASKS": 0.0, "SPEED_MARGIN": 1e9}
    bench = SLOW
    agents = [make_agent(kind="platform", benchmark=bench) for _ in range(3)]
    submit(spec=_adaptive_spec("int8"), tier="platform")
    first = [agent.claim() for agent in agents]
    assert len({task["steps"] for task in first}) == 1
    for agent, task, per_step in zip(agents, first, (0.0005, 0.002, 0.002), strict=True):
        payload, metrics = agent.train(task)
        # held long enough that the server takes its compute_s as it is (it clamps to the lease)
        Task.objects.filter(pk=task["id"]).update(leased_at=timezone.now() - timedelta(minutes=5))
        metrics |= {"compute_s": per_step * metrics["steps"]}
        assert agent.upload(task["id"], payload, metrics).status_code == 202
    fast, slow, _ = (agent.claim() for agent in agents)
    assert fast["round"] == slow["round"] == 2
    assert fast["steps"] == pytest.approx(4 * slow["steps"], rel=0.2)
