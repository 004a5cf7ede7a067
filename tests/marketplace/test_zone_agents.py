"""Regional aggregation with real agents over HTTP: three zones, each with a platform agent
serving its zone endpoint (desktop/zone_server.py) and a member agent, train a zones job to
completion against the live server. Nothing here asserts how fast."""

from __future__ import annotations

import copy
import socket

import pytest

from marketplace.jobs.models import Job
from marketplace.rounds.models import Task, TaskResult, ZonePartial
from tests.live_agents import live_agent
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_desktop_agents import _wait

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_three_zones_of_real_agents_train_a_job(
    live_server, make_user, submit, tmp_path, monkeypatch
) -> None:
    _, provider_key = make_user("provider")
    agents = []
    for zone in ("eu", "us", "ap"):
        listen = f"127.0.0.1:{_free_port()}"
        agents.append(live_agent(tmp_path, f"agg-{zone}", live_server.url, provider_key,
                                 monkeypatch, zone=zone, zone_listen=listen))  # fmt: skip
        agents.append(live_agent(tmp_path, f"member-{zone}", live_server.url, provider_key,
                                 monkeypatch, zone=zone))  # fmt: skip
    # the aggregators register (and serve) before the job exists, so every claim can route
    for agent in agents:
        agent.start()
    try:
        _wait(lambda: all(a.status().node_id for a in agents), 120, "registrations")
        spec = copy.deepcopy(SMALL_SPEC)
        spec["sharding"] = {"method": "stratified", "num_shards": 6}
        spec["aggregation"] = {"hierarchy": "zones"}
        job = submit(spec=spec, tier="platform")
        _wait(lambda: Job.objects.get(pk=job["id"]).status == "completed", 300, "the job")
    finally:
        for agent in agents:
            agent.stop()
    stored = Job.objects.get(pk=job["id"])
    assert stored.rounds_done == 2
    results = TaskResult.objects.filter(task__round__job=stored)
    # one result per task that is done, never two for one task, whichever way it came
    done = Task.objects.filter(round__job=stored, status="done").count()
    assert results.count() == done >= 12
    pooled = results.filter(partial__isnull=False)
    # members routed through their zone's aggregator; aggregators' own tasks went flat
    assert pooled.exists()
    member_nodes = {int(a.status().node_id) for a in agents if a.status().node_id and
                    a._settings.zone_listen == ""}  # fmt: skip
    assert set(pooled.values_list("node_id", flat=True)) <= member_nodes
    for partial in ZonePartial.objects.filter(round__job=stored):
        assert {m["task_id"] for m in partial.manifest} == {
            str(r.task_id) for r in partial.results.all()
        }
        assert partial.zone in ("eu", "us", "ap")
