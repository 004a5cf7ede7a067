"""The promises bench's failure injection (bench.promises_cluster.Killer) through real
processes: once a round, a fifth of the agents holding tasks are killed with SIGKILL and
started again; the rounds close on their quorum without them and the job completes, nothing
counted twice."""

from __future__ import annotations

import copy
import time

import pytest

from bench.promises_cluster import Killer
from marketplace.client import TERMINAL
from marketplace.demo.cluster import NodePlan
from tests.system.harness import PRICE, SPEC, log_tail

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]

# slow enough (a step held to 8x its time) that agents are surely caught holding tasks
NODES = tuple(
    NodePlan(f"gpu-{i}", kind="platform", compute_scale=8.0, price=PRICE) for i in range(5)
)


def test_a_fifth_of_the_agents_killed_each_round_and_the_job_completes(system) -> None:
    spec = copy.deepcopy(SPEC)
    spec["sharding"]["num_shards"] = len(NODES)
    spec["rounds"] = {"max_rounds": 3, "deadline_s": 60, "quorum": 0.8}
    s = system(nodes=NODES, GPUFLEX_NODE_TIMEOUT_S="20")
    s.start()
    s.wait_idle()
    job_id = s.submit(spec)
    killer = Killer(s.cluster, {p.name: p for p in NODES}, fraction=0.2)
    assert killer.count == 1
    restarted: list[tuple[str, int, int]] = []  # name, pid before, pid after
    end = time.monotonic() + 300
    job = s.job(job_id)
    while job["status"] not in TERMINAL:
        assert time.monotonic() < end, f"the job is still {job['status']}"
        before = {n: s.cluster.procs[f"agent-{n}"].pid for n in killer.plans}
        for name in killer(job):
            restarted.append((name, before[name], s.cluster.procs[f"agent-{name}"].pid))
        time.sleep(0.2)
        job = s.job(job_id)

    assert job["status"] == "completed", log_tail(s.cluster, "worker")
    assert killer.killed and len(killer.killed) == len(restarted)
    assert len({k["round"] for k in killer.killed}) == len(killer.killed)  # once a round
    for name, old, new in restarted:
        assert new != old and s.cluster.alive(f"agent-{name}")
    # a round closes on 4 of 5 updates: the killed agent's task is cancelled with it or lost
    assert all(r["metrics"]["participants"] >= 4 for r in s.rounds(job_id))
    report = s.report(job_id)
    assert report["updates_counted_twice"] == 0 and report["tasks_still_leased"] == 0
    assert report["ledger_balanced"], report["ledger_problems"]
