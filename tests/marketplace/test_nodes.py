from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import tick
from tests.marketplace.helpers import client_for


def test_provider_registers_a_node_with_its_own_key(make_agent, provider) -> None:
    agent = make_agent(kind="platform", price="1.25")
    assert agent.key.startswith("gfx_n_")
    node = Node.objects.get(pk=agent.node_id)
    assert node.kind == "platform" and node.gpu_model == "RTX 4090" and node.memory_gb == 24
    assert str(node.price_per_gpu_hour) == "1.2500"
    listed = provider.get("/api/v1/nodes/").json()
    assert listed["count"] == 1 and "node_key" not in listed["results"][0]


def test_buyer_cannot_register_nodes(buyer) -> None:
    response = buyer.post("/api/v1/nodes/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"] == "permission_denied"


def test_registration_validates_fields(provider) -> None:
    response = provider.post(
        "/api/v1/nodes/",
        {"name": "n", "kind": "mainframe", "hardware": {}, "price_per_gpu_hour": "-1"},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert "kind" in body["detail"] and "price_per_gpu_hour" in body["detail"]


def test_node_key_cannot_act_as_its_owner(make_agent) -> None:
    agent = make_agent()
    assert agent.client.get("/api/v1/nodes/").status_code == 403
    assert agent.client.get("/api/v1/jobs/").status_code == 403


def test_user_key_cannot_use_agent_endpoints(provider) -> None:
    assert provider.post("/api/v1/agent/heartbeat", {"state": "idle"}).status_code == 403


def test_heartbeat_updates_state_and_metrics(make_agent) -> None:
    agent = make_agent()
    response = agent.heartbeat("working", task_id="abc", progress=0.5)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"server_time", "heartbeat_interval_s", "lease_timeout_s"}
    node = Node.objects.get(pk=agent.node_id)
    assert node.state == "working"
    assert node.metrics == {"gpu_util": 0.5, "task_id": "abc", "progress": 0.5}
    assert node.live_network == {"rtt_ms": 20.0}


def test_heartbeat_rejects_unknown_state(make_agent) -> None:
    response = make_agent().heartbeat("dancing")
    assert response.status_code == 400
    assert "state" in response.json()["detail"]


def test_silent_node_goes_offline_and_comes_back(make_agent) -> None:
    agent = make_agent()
    Node.objects.filter(pk=agent.node_id).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    tick()
    assert Node.objects.get(pk=agent.node_id).state == "offline"
    agent.heartbeat("idle")
    assert Node.objects.get(pk=agent.node_id).state == "idle"


def test_rotating_a_node_key_revokes_the_old_one(make_agent, provider) -> None:
    agent = make_agent()
    response = provider.post(f"/api/v1/nodes/{agent.node_id}/key")
    assert response.status_code == 201
    assert agent.heartbeat().status_code == 401
    assert client_for(response.json()["node_key"]).get("/api/v1/agent/me").status_code == 200


def test_provider_never_sees_another_providers_node(make_agent, make_user) -> None:
    agent = make_agent()
    _, other = make_user("provider")
    client = client_for(other)
    assert client.get(f"/api/v1/nodes/{agent.node_id}/").status_code == 404
    assert client.post(f"/api/v1/nodes/{agent.node_id}/key").status_code == 404
    assert client.get("/api/v1/nodes/").json()["count"] == 0


def test_agent_me_reports_reliability_and_earnings(make_agent) -> None:
    body = make_agent().client.get("/api/v1/agent/me").json()
    assert body["state"] == "idle" and body["reliability"] == 0.5
    assert body["earnings"] == {"today": "0.000000", "total": "0.000000"}


def test_market_capacity_groups_online_gpus(make_agent, buyer) -> None:
    make_agent(price="0.30")
    make_agent(price="0.50")
    make_agent(kind="platform", price="2.00")
    body = buyer.get("/api/v1/market/capacity").json()
    assert body["online_nodes"] == 3
    volunteer = next(g for g in body["gpus"] if g["kind"] == "volunteer")
    assert volunteer["nodes"] == 2
    assert volunteer["min_price_per_gpu_hour"] == "0.3000"
    assert volunteer["max_price_per_gpu_hour"] == "0.5000"
