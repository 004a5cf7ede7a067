"""Every object-permission rule, attacked: other buyers' jobs and other nodes' tasks are 404."""

from __future__ import annotations

import pytest

from marketplace.jobs.models import Job
from marketplace.rounds.models import Task
from tests.marketplace.helpers import client_for


@pytest.fixture
def job_of_b(make_user, submit):
    _, key = make_user("buyer")
    return submit(client=client_for(key))


def test_buyer_never_sees_another_buyers_job(buyer, job_of_b) -> None:
    job_id = job_of_b["id"]
    assert buyer.get("/api/v1/jobs/").json()["count"] == 0
    for path in ("/", "/rounds/", "/model", "/provenance"):
        response = buyer.get(f"/api/v1/jobs/{job_id}{path}")
        assert response.status_code == 404, path
        assert response.json()["error"] == "not_found"
    for action in ("pause", "resume", "cancel"):
        assert buyer.post(f"/api/v1/jobs/{job_id}/{action}").status_code == 404
    assert Job.objects.get(pk=job_id).status == "running"


def test_operator_sees_every_job_and_node(make_user, job_of_b, make_agent) -> None:
    make_agent()
    _, key = make_user("operator")
    operator = client_for(key)
    assert operator.get(f"/api/v1/jobs/{job_of_b['id']}/").status_code == 200
    assert operator.get("/api/v1/operator/nodes/").json()["count"] == 1
    summary = operator.get("/api/v1/operator/summary").json()
    assert summary["jobs"] == {"running": 1}


def test_operator_endpoints_are_for_operators_only(buyer, provider, make_agent) -> None:
    agent = make_agent()
    for client in (buyer, provider, agent.client):
        assert client.get("/api/v1/operator/nodes/").status_code == 403
        assert client.get("/api/v1/operator/summary").status_code == 403


def test_node_never_sees_another_nodes_task(make_agent, submit) -> None:
    owner, thief = make_agent(kind="platform"), make_agent(kind="platform")
    submit(tier="platform")
    task = owner.claim()
    payload, metrics = owner.train(task)
    tid = task["id"]
    assert thief.model(tid).status_code == 404
    assert thief.shard(tid).status_code == 404
    response = thief.upload(tid, payload, metrics)
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    fail = thief.client.post(f"/api/v1/agent/tasks/{tid}/fail", {"reason": "oom"}, format="json")
    assert fail.status_code == 404
    db_task = Task.objects.get(pk=tid)
    assert db_task.status == "leased" and db_task.node_id == owner.node_id
    assert owner.upload(tid, payload, metrics).status_code == 202


def test_node_keys_cannot_use_buyer_endpoints(make_agent, job_of_b) -> None:
    agent = make_agent()
    assert agent.client.get(f"/api/v1/jobs/{job_of_b['id']}/").status_code == 403
    assert agent.client.post("/api/v1/jobs/", {}, format="json").status_code == 403
    assert agent.client.get("/api/v1/keys/").status_code == 403


def test_buyer_keys_cannot_use_agent_endpoints(buyer) -> None:
    assert buyer.post("/api/v1/agent/claim").status_code == 403
    assert buyer.get("/api/v1/agent/me").status_code == 403


def test_provider_cannot_see_jobs(provider, job_of_b) -> None:
    assert provider.get("/api/v1/jobs/").status_code == 403
    assert provider.get(f"/api/v1/jobs/{job_of_b['id']}/").status_code == 403
