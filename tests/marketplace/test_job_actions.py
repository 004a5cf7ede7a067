"""Pause, resume and cancel, as the buyer sees them and as nodes feel them."""

from __future__ import annotations

import pytest

from marketplace.rounds.models import Round, Task

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_stops_leasing_and_resume_restarts_it(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    first = agent.claim()
    paused = buyer.post(f"/api/v1/jobs/{job['id']}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert agent.claim() is None
    # work leased before the pause may still come back
    assert agent.work(first).status_code == 202
    assert buyer.post(f"/api/v1/jobs/{job['id']}/pause").status_code == 409
    resumed = buyer.post(f"/api/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "running"
    assert agent.claim() is not None


def test_cancel_ends_the_job_and_its_leases(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    task = agent.claim()
    cancelled = buyer.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert set(Task.objects.values_list("status", flat=True)) == {"cancelled"}
    assert Round.objects.get().status == "cancelled"
    response = agent.work(task)
    assert response.status_code == 409 and response.json()["error"] == "conflict"
    assert agent.claim() is None
    again = buyer.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert "already cancelled" in again.json()["detail"]
