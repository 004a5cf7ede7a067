"""A job runs its rounds with several HTTP clients acting as nodes, on PostgreSQL."""

from __future__ import annotations

import pytest

from marketplace.jobs.models import Job
from marketplace.rounds.aggregation import artifact_store
from marketplace.rounds.models import TaskResult
from tests.marketplace.helpers import SMALL_SPEC
from trainer.hashing import state_hash
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)


def run_until_idle(agents, cheaters=(), limit: int = 200) -> int:
    """Every agent claims and works until nobody gets anything; returns tasks worked."""
    done = 0
    for _ in range(limit):
        worked = False
        for agent in agents:
            task = agent.claim()
            if task is not None:
                response = agent.work(task, cheat=agent in cheaters)
                assert response.status_code == 202, response.content
                worked, done = True, done + 1
        if not worked:
            return done
    raise AssertionError("work never ran out")


def test_job_completes_its_rounds_with_three_platform_nodes(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(tier="platform")
    assert job["status"] == "running" and job["current_round"] == 1

    assert run_until_idle(agents) == 6  # 3 shards x 2 rounds, no replicas on platform nodes

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["rounds_done"] == 2
    rounds = buyer.get(f"/api/v1/jobs/{job['id']}/rounds/").json()["results"]
    assert [r["number"] for r in rounds] == [1, 2]
    assert all(r["metrics"]["participants"] == 3 for r in rounds)
    assert rounds[1]["metrics"]["loss"] < rounds[0]["metrics"]["loss"]  # real training

    model = buyer.get(f"/api/v1/jobs/{job['id']}/model")
    assert model.status_code == 200
    state, _ = decode_state(model.content)
    assert state_hash(state) == detail["model_hash"] == model["X-GPUFlex-Model-Hash"]

    provenance = buyer.get(f"/api/v1/jobs/{job['id']}/provenance")
    chain = ProvenanceChain.from_json(provenance.content.decode())
    assert len(chain) == 2 and chain.records[-1].output_model_hash == detail["model_hash"]
    spec = parse_spec(detail["spec"])
    report = verify_with_artifacts(chain, artifact_store(), spec.aggregation)
    assert report.ok, str(report)
    # every result was aggregated and credited at the node's price
    assert TaskResult.objects.filter(credited=True).count() == 6


def test_target_metric_ends_the_job_early(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = SMALL_SPEC | {
        "rounds": {"max_rounds": 50, "target": {"metric": "accuracy", "value": 0.5}}
    }
    job = submit(spec, tier="platform")
    run_until_idle(agents)
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed" and done.reached_target
    assert done.rounds_done < 50


def test_volunteers_verify_each_other_and_get_paid(make_agent, submit, buyer) -> None:
    agents = [make_agent() for _ in range(4)]
    job = submit(tier="volunteer", spec=SMALL_SPEC | {"rounds": {"max_rounds": 1}})
    run_until_idle(agents)
    assert Job.objects.get(pk=job["id"]).status == "completed"
    results = TaskResult.objects.all()
    # new nodes are untrusted: every unit ran twice and the replicas agreed
    assert results.count() == 6
    assert all(r.verified is True and r.credited for r in results)
    me = agents[0].client.get("/api/v1/agent/me").json()
    assert me["reliability"] > 0.5
    assert float(me["earnings"]["total"]) > 0


def test_upload_is_idempotent_and_cannot_be_replaced(make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    submit(tier="platform")
    agent = agents[0]
    task = agent.claim()
    payload, metrics = agent.train(task)
    assert agent.upload(task["id"], payload, metrics).status_code == 202
    again = agent.upload(task["id"], payload, metrics)
    assert again.status_code == 200 and again.json() == {"accepted": True, "checked": True}
    other = payload[:-4] + b"\x00\x00\x00\x00"
    conflict = agent.upload(task["id"], other, metrics)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "conflict"
    assert TaskResult.objects.count() == 1
