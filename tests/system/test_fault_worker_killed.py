"""kill -9 the Celery worker during aggregation and start it again: the round completes
exactly once, no update is lost or counted twice."""

from __future__ import annotations

import signal
import time

import pytest

from tests.system.harness import log_tail, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]


def test_aggregation_survives_a_killed_worker(system) -> None:
    s = system()
    s.cluster.start_web()
    # the worker pauses after computing round 2 (checkpoint written), before its commit
    s.cluster.start_worker(GPUFLEX_FAILPOINTS="aggregation.before_commit=sleep:15")
    for plan in s.nodes:
        s.cluster.configure_agent(plan, s.provider_key)
        s.cluster.start_agent(plan)
    job_id = s.submit()

    def aggregating() -> dict | None:
        rounds = s.rounds(job_id)
        return next((r for r in rounds if r["status"] == "aggregating"), None)

    stuck = wait_for(aggregating, 180, "a round to start aggregating")
    time.sleep(3)  # inside the failpoint: computed, not committed
    s.cluster.kill("worker", signal.SIGKILL)
    time.sleep(1)
    assert next(r for r in s.rounds(job_id) if r["number"] == stuck["number"])["status"] == (
        "aggregating"
    ), "the kill came too late: " + log_tail(s.cluster, "worker")

    s.cluster.start_worker()  # no failpoint: the tick restarts the stalled aggregation
    job = s.wait_done(job_id, timeout=300)
    assert job["status"] == "completed"
    rounds = s.rounds(job_id)
    assert [r["number"] for r in rounds] == [1, 2, 3, 4, 5]
    assert all(r["status"] == "done" and r["metrics"]["participants"] == 3 for r in rounds)
    report = s.report(job_id)
    assert report["updates_counted_twice"] == 0 and report["tasks_still_leased"] == 0
    assert report["charges"] == report["verified_contributions"] == 15
    assert report["ledger_balanced"], report["ledger_problems"]
    assert report["provenance_verified"]  # one record per round, each replaying to its hash
