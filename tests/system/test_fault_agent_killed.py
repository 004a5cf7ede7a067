"""kill -9 an agent mid-task: its task is reassigned, the job finishes, nobody is paid twice."""

from __future__ import annotations

import signal

import pytest

from marketplace.demo.cluster import NodePlan
from tests.system.harness import PRICE, log_tail, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]

NODES = (
    NodePlan("steady-1", kind="platform", price=PRICE),
    NodePlan("steady-2", kind="platform", price=PRICE),
    # slow enough that it is surely caught holding a task
    NodePlan("victim", kind="platform", compute_scale=8.0, price=PRICE),
)


def test_killed_agent_loses_its_lease_and_the_job_completes(system) -> None:
    s = system(nodes=NODES)
    s.start()
    job_id = s.submit()

    def victim_working() -> bool:
        task = s.agent_status("victim").get("task")
        return bool(task and task.get("phase") in ("training", "downloading"))

    wait_for(victim_working, 120, "the victim agent to hold a task", every=0.1)
    s.cluster.kill("agent-victim", signal.SIGKILL)  # the agent and its sandboxed task

    job = s.wait_done(job_id, timeout=300)
    assert job["status"] == "completed", log_tail(s.cluster, "worker")
    report = s.report(job_id)
    victim = next(n for n in report["nodes"] if n["name"] == "victim")
    assert victim["lost_leases"] >= 1  # its lease expired and the task went to another node
    assert report["rounds"] == 5 and report["updates_counted_twice"] == 0
    assert report["charges"] == report["verified_contributions"]  # each paid exactly once
    assert report["tasks_still_leased"] == 0
    assert report["ledger_balanced"], report["ledger_problems"]
    assert report["provenance_verified"]
