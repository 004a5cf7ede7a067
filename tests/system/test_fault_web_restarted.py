"""Restart the web server mid-job: agents reconnect and the job continues to the end."""

from __future__ import annotations

import signal
import time

import pytest

from tests.system.harness import log_tail, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("system")]


def test_agents_ride_out_a_web_server_restart(system) -> None:
    s = system()
    s.start()
    s.wait_idle()
    job_id = s.submit()
    wait_for(lambda: s.job(job_id)["rounds_done"] >= 1, 180, "round 1 to finish")

    s.cluster.kill("web", signal.SIGKILL)
    time.sleep(4)  # agents see connection errors and back off
    s.cluster.start_web()  # same port, same database

    job = s.wait_done(job_id, timeout=300)
    assert job["status"] == "completed", log_tail(s.cluster, "agent-p0")
    report = s.report(job_id)
    assert report["rounds"] == 5 and all(n["tasks"] > 0 for n in report["nodes"])
    assert report["updates_counted_twice"] == 0 and report["tasks_still_leased"] == 0
    assert report["ledger_balanced"], report["ledger_problems"]
    assert report["provenance_verified"]
