"""Regional aggregation (`aggregation.hierarchy: zones`) through the agent API: members hand
their updates to their zone's aggregator (desktop.zone_server.ZoneAggregator, driven here
without its HTTP front), which sends one partial per zone; the coordinator's result equals
the flat FedAvg of the same updates, and a failing aggregator loses and doubles nothing."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
import torch
from django.utils import timezone

from desktop.client import ApiError
from desktop.zone_server import Refused, ZoneAggregator
from marketplace.jobs.models import Job
from marketplace.nodes import presence
from marketplace.nodes.models import Node, NodeState
from marketplace.rounds.aggregation import artifact_store
from marketplace.rounds.maintenance import reclaim_leases
from marketplace.rounds.models import Round, Task, TaskResult, TaskStatus, ZonePartial
from tests.marketplace.agents import Agent
from tests.marketplace.helpers import SMALL_SPEC
from trainer.aggregation import ClientUpdate, build_strategy
from trainer.compression import decode_any
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

ZONES_SPEC = SMALL_SPEC | {
    "sharding": {"method": "stratified", "num_shards": 6},
    "aggregation": {"hierarchy": "zones"},
}


class ApiZoneClient:
    """The aggregator's MarketplaceClient calls, over Django's test client."""

    def __init__(self, agent: Agent) -> None:
        self.c = agent.client

    @staticmethod
    def _ok(r: Any) -> Any:
        if r.status_code >= 400:
            body = r.json()
            raise ApiError(r.status_code, str(body.get("error")), str(body.get("detail")))
        return r

    def zone_round(self, round_id: int) -> dict[str, Any]:
        return self._ok(self.c.get(f"/api/v1/agent/zone/rounds/{round_id}")).json()

    def zone_model(self, round_id: int) -> bytes:
        return self._ok(self.c.get(f"/api/v1/agent/zone/rounds/{round_id}/model")).content

    def put_partial(self, data: bytes) -> int:
        r = self.c.put(
            "/api/v1/agent/zone/partial", data=data, content_type="application/octet-stream"
        )
        return self._ok(r).status_code


def hand_off(agent: Agent, task: dict[str, Any], payload: bytes) -> Any:
    digest = hashlib.sha256(payload).hexdigest()
    body = {"aggregator_id": task["zone"]["aggregator"], "update_hash": digest}
    return agent.client.post(f"/api/v1/agent/tasks/{task['id']}/handoff", body, format="json")


def member_work(agent: Agent, task: dict[str, Any], aggregators: dict[int, ZoneAggregator],
                seen: list) -> None:  # fmt: skip
    """The agent's _deliver for a zone task: hand off, then upload to the aggregator."""
    payload, metrics = agent.train(task)
    zone = task["zone"]
    assert hand_off(agent, task, payload).status_code == 200
    code = aggregators[zone["aggregator"]].receive(
        zone["round_id"], task["id"], str(agent.node_id), zone["samples"], zone["token"],
        metrics, payload,
    )  # fmt: skip
    assert code == 202
    seen.append((task, payload))


@pytest.fixture
def zones(make_agent) -> dict[str, Any]:
    """Three zones, each with an aggregator and two platform members (no replicas)."""
    out: dict[str, Any] = {"members": [], "aggregators": {}, "agg_agents": {}}
    for z in ("eu", "us", "ap"):
        agg = make_agent(kind="platform", zone=z, zone_url=f"http://agg-{z}.test:8470")
        out["agg_agents"][z] = agg
        out["aggregators"][agg.node_id] = ZoneAggregator(ApiZoneClient(agg), z)
        out["members"] += [make_agent(kind="platform", zone=z) for _ in range(2)]
    return out


def _round_updates(seen, model_state, spec) -> list[ClientUpdate]:
    updates = []
    for task, payload in seen:
        delta, _ = decode_any(payload, model_state, max_norm=spec.aggregation.max_update_norm)
        samples = task["zone"]["samples"]
        updates.append(ClientUpdate(task["id"], delta, samples))
    return updates


def test_three_zones_send_one_partial_each_and_equal_flat_fedavg(zones, submit, buyer) -> None:
    job = submit(ZONES_SPEC, tier="platform")
    spec = parse_spec(job["spec"])
    for number in (1, 2):
        rnd = Round.objects.get(job_id=job["id"], number=number)
        model_state, _ = decode_state(open_model(rnd))
        seen: list = []
        # every member leases its task first (as the round opens), then works
        claimed = [(agent, agent.claim()) for agent in zones["members"]]
        for agent, task in claimed:
            assert task is not None and task["zone"]["name"] in ("eu", "us", "ap")
            member_work(agent, task, zones["aggregators"], seen)
        rnd.refresh_from_db()
        # each zone flushed once, when its two expected members were in: 3 partials, not 6
        partials = ZonePartial.objects.filter(round=rnd)
        assert partials.count() == 3
        assert sorted(len(p.manifest) for p in partials) == [2, 2, 2]
        assert rnd.status == "done"
        # FedAvg exact: the flat mean of the same six updates
        flat = build_strategy(spec.aggregation).aggregate(
            model_state, _round_updates(seen, model_state, spec)
        )
        after = Round.objects.get(job_id=job["id"], number=number + 1) if number == 1 else None
        result = (
            decode_state(open_model(after))[0]
            if after
            else decode_state(buyer.get(f"/api/v1/jobs/{job['id']}/model").content)[0]
        )
        for k in flat:
            torch.testing.assert_close(result[k], flat[k], rtol=1e-5, atol=1e-6)
        assert rnd.metrics["participants"] == 6
        # fan-in: the coordinator received three partials instead of six updates
        member_bytes = sum(len(p) for _, p in seen)
        assert sum(p.size for p in partials) < 0.6 * member_bytes

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed"
    results = TaskResult.objects.filter(task__round__job_id=job["id"])
    assert results.count() == 12 and all(r.credited and r.partial_id for r in results)
    chain = ProvenanceChain.from_json(buyer.get(f"/api/v1/jobs/{job['id']}/provenance").content)
    record = chain.records[-1]
    assert len(record.contributions) == 3
    for c in record.contributions:
        assert c.node_id.startswith("zone:") and len(c.members) == 2
        # per member: its task, node, update hash (as the member uploaded it) and shard
        assert {"task_id", "node_id", "update_hash", "samples", "shard_hash"} <= set(c.members[0])
    assert verify_with_artifacts(chain, artifact_store(), spec.aggregation).ok


def open_model(rnd: Round) -> bytes:
    from marketplace.jobs import files

    return files.get(rnd.input_model_file)


def test_nodes_show_their_zone_and_only_platform_nodes_aggregate(make_agent, provider) -> None:
    agent = make_agent(zone="eu")
    node = provider.get(f"/api/v1/nodes/{agent.node_id}/").json()
    assert node["zone"] == "eu" and node["zone_url"] == ""
    body = {
        "name": "x", "hardware": {"gpu_vendor": "nvidia", "gpu_model": "A", "memory_gb": 8},
        "price_per_gpu_hour": "0.4", "zone": "eu", "zone_url": "http://x.test:1",
    }  # fmt: skip
    refused = provider.post("/api/v1/nodes/", body, format="json")
    assert refused.status_code == 400 and "zone_url" in refused.content.decode()
    bad_zone = provider.post(
        "/api/v1/nodes/", body | {"zone": "e u", "zone_url": ""}, format="json"
    )
    assert bad_zone.status_code == 400 and "zone" in bad_zone.content.decode()


def test_a_zone_without_an_aggregator_uploads_flat(make_agent, submit) -> None:
    members = [make_agent(kind="platform", zone="eu") for _ in range(2)]
    submit(ZONES_SPEC | {"sharding": {"method": "stratified", "num_shards": 2}}, tier="platform")
    for agent in members:
        task = agent.claim()
        assert "zone" not in task
        assert agent.work(task).status_code == 202
    assert ZonePartial.objects.count() == 0
    assert TaskResult.objects.filter(partial__isnull=True).count() == 2


def test_flat_jobs_never_route_through_a_zone(make_agent, submit) -> None:
    make_agent(kind="platform", zone="eu", zone_url="http://agg.test:1")
    member = make_agent(kind="platform", zone="eu")
    submit(SMALL_SPEC, tier="platform")
    assert "zone" not in member.claim()


def test_a_member_token_is_checked(zones, submit) -> None:
    submit(ZONES_SPEC, tier="platform")
    agent = zones["members"][0]
    task = agent.claim()
    payload, metrics = agent.train(task)
    zone = task["zone"]
    aggregator = zones["aggregators"][zone["aggregator"]]
    for node, samples, token in [
        (str(agent.node_id + 1), zone["samples"], zone["token"]),  # another node
        (str(agent.node_id), zone["samples"] + 1, zone["token"]),  # another weight
        (str(agent.node_id), zone["samples"], "0" * 64),
    ]:
        with pytest.raises(Refused) as exc:
            aggregator.receive(zone["round_id"], task["id"], node, samples, token, metrics, payload)
        assert exc.value.status == 403
    # an update the coordinator would refuse is refused here too, with the same reason
    bad = {k: v * float("nan") for k, v in decode_state(payload)[0].items()}
    from trainer.updates import encode_state

    with pytest.raises(Refused) as exc:
        aggregator.receive(zone["round_id"], task["id"], str(agent.node_id), zone["samples"],
                           zone["token"], metrics, encode_state(bad))  # fmt: skip
    assert exc.value.status == 422 and "NaN" in exc.value.detail


def test_a_dead_aggregator_releases_its_members_and_counts_nothing_twice(zones, submit) -> None:
    job = submit(ZONES_SPEC, tier="platform")
    eu = zones["agg_agents"]["eu"]
    eu_members = [a for a in zones["members"] if Node.objects.get(pk=a.node_id).zone == "eu"]
    first, second = eu_members
    t1, t2 = first.claim(), second.claim()  # both in flight: the aggregator waits for both
    p1, m1 = first.train(t1)
    assert hand_off(first, t1, p1).status_code == 200
    agg = zones["aggregators"][eu.node_id]
    assert agg.receive(t1["zone"]["round_id"], t1["id"], str(first.node_id),
                       t1["zone"]["samples"], t1["zone"]["token"], m1, p1) == 202  # fmt: skip
    # the aggregator dies holding the update (the second member has not finished): what it
    # last said of itself is written first, then it falls silent
    presence.flush()
    Node.objects.filter(pk=eu.node_id).update(
        state=NodeState.OFFLINE, last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert reclaim_leases() >= 1
    task = Task.objects.get(pk=t1["id"])
    assert task.status == TaskStatus.PENDING and task.zone_aggregator_id is None
    # the member is not blamed for the aggregator's failure
    assert Node.objects.get(pk=first.node_id).lost_leases == 0
    # the aggregator comes back and flushes what it held: refused, nothing counted
    with pytest.raises(ApiError) as exc:
        ApiZoneClient(eu).put_partial(_partial_of(agg, t1["zone"]["round_id"]))
    assert exc.value.status == 409
    assert not TaskResult.objects.filter(task_id=t1["id"]).exists()
    # the second member finds no aggregator to hand to and uploads its update flat
    p2, m2 = second.train(t2)
    assert hand_off(second, t2, p2).status_code == 409
    assert second.upload(t2["id"], p2, m2).status_code == 202
    # with no aggregator online in eu, the released task goes flat now and counts once
    again = first.claim()
    assert again["id"] == t1["id"] and "zone" not in again
    assert first.work(again).status_code == 202
    results = TaskResult.objects.filter(task__round__job_id=job["id"])
    assert sorted(str(r.task_id) for r in results) == sorted([t1["id"], t2["id"]])
    assert not results.filter(partial__isnull=False).exists()


def _partial_of(agg: ZoneAggregator, round_id: int) -> bytes:
    from trainer.zones import PartialSum, encode_partial

    rnd = agg.rounds[round_id]
    partial = PartialSum()
    for delta, member in rnd.held.values():
        partial.add(delta, member)
    return encode_partial(partial, job_id=rnd.job_id, round_id=str(round_id), zone="eu")


def test_a_partial_naming_a_task_it_may_not_is_refused_whole(zones, submit) -> None:
    submit(ZONES_SPEC, tier="platform")
    us = zones["agg_agents"]["us"]
    members = [a for a in zones["members"] if Node.objects.get(pk=a.node_id).zone == "us"]
    tasks = []
    for agent in members:
        task = agent.claim()
        payload, metrics = agent.train(task)
        assert hand_off(agent, task, payload).status_code == 200
        tasks.append((agent, task, payload, metrics))
    agg = zones["aggregators"][us.node_id]
    # the first member is held; the second lies about its bytes (another hash than handed)
    a, t, p, m = tasks[0]
    agg.receive(t["zone"]["round_id"], t["id"], str(a.node_id), t["zone"]["samples"],
                t["zone"]["token"], m, p)  # fmt: skip
    b, u, q, n = tasks[1]
    swapped = {k: v * 0.5 for k, v in decode_state(q)[0].items()}
    from trainer.updates import encode_state

    assert agg.receive(u["zone"]["round_id"], u["id"], str(b.node_id), u["zone"]["samples"],
                       u["zone"]["token"], n, encode_state(swapped)) == 202  # fmt: skip
    # the flush was refused whole (409) and both tasks went back to the queue
    assert ZonePartial.objects.count() == 0 and TaskResult.objects.count() == 0
    statuses = set(Task.objects.filter(pk__in=[t["id"], u["id"]]).values_list("status", flat=True))
    assert statuses == {TaskStatus.PENDING}
    assert not agg.rounds[t["zone"]["round_id"]].held


def test_zone_endpoints_are_for_aggregators_of_zone_jobs(zones, submit, make_agent) -> None:
    job = submit(SMALL_SPEC, tier="platform")  # a flat job
    rnd = Round.objects.get(job_id=job["id"], number=1)
    agg = zones["agg_agents"]["eu"]
    assert agg.client.get(f"/api/v1/agent/zone/rounds/{rnd.pk}").status_code == 404
    member = zones["members"][0]
    zjob = submit(ZONES_SPEC, tier="platform")
    zrnd = Round.objects.get(job_id=zjob["id"], number=1)
    assert member.client.get(f"/api/v1/agent/zone/rounds/{zrnd.pk}").status_code == 409
    info = agg.client.get(f"/api/v1/agent/zone/rounds/{zrnd.pk}").json()
    assert info["open"] and info["expected"] == [] and len(info["key"]) == 64
    assert json.loads(json.dumps(info["spec"]))["aggregation"]["hierarchy"] == "zones"
    assert Job.objects.count() == 2
