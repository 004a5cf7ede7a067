"""Far nodes sync every other round (trainer.adapt.plan_round: their transfers take over
`adaptation.far_sync_factor` x the median's): the round's plan gives a far node a two-round
task, the round closes without it, the task trains on past the close whatever
`rounds.late_updates` says, the next round folds its update in with the staleness weight,
and the far node sits that next round out."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
import torch
from django.utils import timezone

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.ledger.reconcile import reconcile
from marketplace.rounds.aggregation import artifact_store
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Round, Task, TaskResult
from marketplace.rounds.sizing import is_far
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import SMALL_SPEC
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.rounds import staleness_weight
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

BENCHMARK = {"train_samples_per_s": {"mlp": 64000}}
NEAR = {"rtt_ms": 20, "up_mbps": 100, "down_mbps": 300}
# transfers about 20x the near nodes': far above far_sync_factor (3) x the median
FAR = {"rtt_ms": 400, "up_mbps": 5, "down_mbps": 5}


def _spec(late: str, *, quorum: float = 1.0, shards: int = 4) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["adaptation"] = {"enabled": True, "max_local_steps": 400, "min_local_steps": 2}
    spec["rounds"] = {"max_rounds": 3, "quorum": quorum, "late_updates": late}
    spec["sharding"] = {"method": "stratified", "num_shards": shards}
    return spec


def _fleet(make_agent) -> tuple[list[Agent], Agent]:
    """Two near nodes and a far one, alike but for their links (registered before the job,
    so that its first round's plan covers them)."""
    near = [make_agent(kind="platform", benchmark=BENCHMARK, network=NEAR) for _ in range(2)]
    return near, make_agent(kind="platform", benchmark=BENCHMARK, network=FAR)


def _round(job: dict[str, Any], number: int) -> Round:
    return Round.objects.get(job_id=job["id"], number=number)


def _work_round(agents: list[Agent], job: dict[str, Any], number: int) -> int:
    """The agents claim and work until round `number` closes; returns the tasks worked."""
    worked = 0
    while _round(job, number).status == "open":
        tasks = [(agent, agent.claim()) for agent in agents]
        tasks = [(agent, task) for agent, task in tasks if task is not None]
        assert tasks, f"round {number} is open but nobody can work on it"
        for agent, task in tasks:
            assert task["round"] == number
            assert agent.work(task).status_code == 202
            worked += 1
    return worked


def _assert_folded_stale(buyer, job: dict[str, Any], late: TaskResult, far: Agent) -> None:
    """Round 2's provenance holds the far node's update at 1/sqrt(2) of what it sent, and
    replays; its shard also trained afresh in round 2, both counted once."""
    chain = ProvenanceChain.from_json(buyer.get(f"/api/v1/jobs/{job['id']}/provenance").content)
    spec = Job.objects.get(pk=job["id"]).parsed_spec
    assert verify_with_artifacts(chain, artifact_store(), spec.aggregation).ok
    contributions = chain.records[1].contributions
    folded = [c for c in contributions if c.node_id == str(far.node_id)]
    assert len(folded) == 1
    stored = artifact_store().get_state(folded[0].update_hash)
    sent, _ = decode_state(files.get(late.update_file))
    for name, tensor in sent.items():  # one round stale
        assert torch.allclose(stored[name], tensor * staleness_weight(1))
    assert staleness_weight(1) == pytest.approx(2**-0.5)
    shard = late.task.shard.content_hash
    assert [c.shard_hash for c in contributions].count(shard) == 2  # late and fresh


@pytest.mark.parametrize("late_updates", ["drop", "stale"])
def test_a_far_node_syncs_every_other_round(make_agent, submit, buyer, late_updates) -> None:
    near, far = _fleet(make_agent)
    job = submit(spec=_spec(late_updates), tier="platform", budget="10")
    first = _round(job, 1)
    assert first.plan[f"n{far.node_id}"]["sync_every"] == 2
    assert {first.plan[f"n{a.node_id}"]["sync_every"] for a in near} == {1}

    two_round = far.claim()
    steps = first.plan[f"n{near[0].node_id}"]["steps"]
    assert two_round["steps"] == first.plan[f"n{far.node_id}"]["steps"]
    assert two_round["steps"] == pytest.approx(2 * steps, rel=0.1)  # a two-round window
    assert far.claim() is None  # one task a round, though a shard is still pending

    # quorum 1 of the units not leased to the far node: round 1 closes without it
    assert _work_round(near, job, 1) == 3
    one = _round(job, 1)
    assert one.status == "done" and one.metrics["participants"] == 3
    assert Task.objects.get(pk=two_round["id"]).status == "leased"  # not cancelled, even by drop

    assert far.work(two_round).status_code == 202  # after its round closed: late, kept
    late = TaskResult.objects.select_related("task__shard").get(task_id=two_round["id"])
    assert late.late and late.accepted and not late.aggregated
    assert far.claim() is None  # its two-round task spanned round 2: it sits that one out
    assert Task.objects.filter(round=_round(job, 2), status="pending").exists()

    assert _work_round(near, job, 2) == 4
    two = _round(job, 2)
    assert two.metrics["late_folded"] == 1 and two.metrics["participants"] == 5
    late.refresh_from_db()
    assert late.aggregated and late.credited  # folded, and paid for
    _assert_folded_stale(buyer, job, late, far)

    third = far.claim()  # round 3: a new two-round task
    assert third["round"] == 3
    assert third["steps"] == _round(job, 3).plan[f"n{far.node_id}"]["steps"]
    assert reconcile(with_chain=False).ok


def test_a_near_task_in_flight_is_still_cancelled_with_drop(make_agent, submit) -> None:
    (quick, slow), far = _fleet(make_agent)
    job = submit(spec=_spec("drop", quorum=0.5, shards=3), tier="platform")
    two_round, done, straggler = far.claim(), quick.claim(), slow.claim()
    # half the two units not leased to the far node: the first upload closes the round
    assert quick.work(done).status_code == 202
    assert _round(job, 1).status == "done"
    assert Task.objects.get(pk=straggler["id"]).status == "cancelled"
    response = slow.work(straggler)
    assert response.status_code == 409 and "cancelled" in response.json()["detail"]
    assert Task.objects.get(pk=two_round["id"]).status == "leased"
    assert far.work(two_round).status_code == 202

    _work_round([quick, slow], job, 2)
    assert _round(job, 2).metrics["late_folded"] == 1
    assert TaskResult.objects.get(task_id=two_round["id"]).aggregated
    assert not TaskResult.objects.filter(task_id=straggler["id"]).exists()


def test_a_stalled_round_keeps_the_far_task_out_of_its_quorum(make_agent, submit) -> None:
    """Past its deadline with nothing to aggregate, a round lets anyone take its work, but
    still knows the far node's task for what it is: closing does not wait for it."""
    near, far = _fleet(make_agent)
    job = submit(spec=_spec("drop", shards=3), tier="platform")
    first = _round(job, 1)
    two_round, *tasks = far.claim(), near[0].claim(), near[1].claim()
    Round.objects.filter(pk=first.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    tick()
    first.refresh_from_db()
    assert first.status == "open" and set(first.plan) == {f"n{far.node_id}"}
    for agent, task in zip(near, tasks, strict=True):
        assert agent.work(task).status_code == 202
    assert _round(job, 1).status == "done"
    assert far.work(two_round).status_code == 202
    _work_round(near, job, 2)
    assert _round(job, 2).metrics["late_folded"] == 1


def test_the_far_lease_closes_a_round_that_waited_only_for_it(make_agent, submit) -> None:
    """The near nodes settled every other unit; the round waited for the last one. Once the
    far node leases it for two rounds, nothing is left to wait for: the claim closes it."""
    near, far = _fleet(make_agent)
    job = submit(spec=_spec("stale", shards=3), tier="platform")
    for agent in near:
        assert agent.work(agent.claim()).status_code == 202
    assert _round(job, 1).status == "open"
    two_round = far.claim()
    assert two_round is not None and two_round["round"] == 1
    assert _round(job, 1).status != "open"
    assert Task.objects.get(pk=two_round["id"]).status == "leased"


def _volunteers(make_agent) -> tuple[list[Agent], Agent]:
    """As `_fleet`, but untrusted volunteers: every task they take is replicated."""
    near = [make_agent(benchmark=BENCHMARK, network=NEAR) for _ in range(2)]
    return near, make_agent(benchmark=BENCHMARK, network=FAR)


def test_a_far_task_is_not_replicated(make_agent, submit) -> None:
    """A replica's on-time result would settle the unit, and the far node's update, folded
    in a round later, would be thrown away: its two-round task goes unreplicated."""
    near, far = _volunteers(make_agent)
    job = submit(spec=_spec("stale", shards=3), tier="hybrid")
    assert _round(job, 1).plan[f"n{far.node_id}"]["sync_every"] == 2
    two_round = far.claim()
    unit = Task.objects.get(pk=two_round["id"])
    assert Task.objects.filter(round=unit.round, shard=unit.shard).count() == 1
    mine = near[0].claim()  # a near volunteer's task is replicated as ever
    near_unit = Task.objects.get(pk=mine["id"])
    assert Task.objects.filter(round=near_unit.round, shard=near_unit.shard).count() == 2


def test_a_far_node_takes_no_replica_in_its_far_round(make_agent, submit) -> None:
    """Its result would come after the round it verifies closed: the replicas go to the near
    nodes, each never one of its own unit."""
    near, far = _volunteers(make_agent)
    job = submit(spec=_spec("stale", shards=2), tier="hybrid")
    primaries = [agent.claim() for agent in near]
    assert {Task.objects.get(pk=t["id"]).replica for t in primaries} == {0}
    assert Task.objects.filter(round=_round(job, 1), replica=1, status="pending").count() == 2
    assert far.claim() is None
    replicas = [agent.claim() for agent in near]
    assert {Task.objects.get(pk=t["id"]).replica for t in replicas} == {1}


def test_plans_without_sync_every_have_no_far_nodes() -> None:
    entry = {"participate": True, "steps": 8, "batch_size": 32, "codec": "none"}
    assert not is_far({"n1": entry}, 1)  # stored before far nodes were planned
    assert is_far({"n1": entry | {"sync_every": 2}}, 1)
    assert not is_far({"n1": entry | {"sync_every": 2, "participate": False}}, 1)
    assert not is_far({}, 1) and not is_far({"n1": entry | {"sync_every": 2}}, None)
