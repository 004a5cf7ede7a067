"""`rounds.mode: naive` through real processes: the marketplace, its worker and three agent
processes train one local step a round on every shard, uncompressed, and every round waits
for all of them; an agent killed mid-job is noticed by its silence (GPUFLEX_NODE_TIMEOUT_S)
and its work goes to another node, so a naive round, which needs every shard, still closes."""

from __future__ import annotations

import copy
import signal

import pytest

from marketplace.demo.cluster import NodePlan
from tests.system.harness import PRICE, SPEC, log_tail, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]

NODES = (
    NodePlan("steady-1", kind="platform", price=PRICE),
    NodePlan("steady-2", kind="platform", price=PRICE),
    # one step is milliseconds: this slow, it is surely caught holding a task
    NodePlan("victim", kind="platform", compute_scale=200.0, price=PRICE),
)


def test_a_naive_job_runs_every_shard_one_step_a_round_and_survives_a_kill(system) -> None:
    spec = copy.deepcopy(SPEC)
    del spec["local"]
    spec["rounds"] = {"mode": "naive", "max_rounds": 4, "deadline_s": 60}
    s = system(nodes=NODES)
    s.start()
    job_id = s.submit(spec)

    def victim_holds_a_task() -> bool:
        task = s.agent_status("victim").get("task")
        return bool(task and task.get("phase") in ("training", "downloading"))

    wait_for(victim_holds_a_task, 120, "the victim agent to hold a task", every=0.1)
    s.cluster.kill("agent-victim", signal.SIGKILL)

    job = s.wait_done(job_id, timeout=300)
    assert job["status"] == "completed", log_tail(s.cluster, "worker")
    rounds = s.rounds(job_id)
    assert len(rounds) == 4
    # every round aggregated an update from every one of the three shards
    assert [r["metrics"]["participants"] for r in rounds] == [3, 3, 3, 3]
    report = s.report(job_id)
    victim = next(n for n in report["nodes"] if n["name"] == "victim")
    assert victim["lost_leases"] >= 1
    assert report["tasks_still_leased"] == 0 and report["updates_counted_twice"] == 0
