"""Health-weighted aggregation in the marketplace (spec aggregation.weighting: health): each
update weighs num_samples x its node's health, taken from the round's plan for adaptive jobs
and from the node's record otherwise; robust strategies refuse it at submission."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from marketplace.jobs import files
from marketplace.jobs.models import Job
from marketplace.jobs.models_io import load_model_file
from marketplace.nodes.models import Node
from marketplace.rounds import tasks
from marketplace.rounds.aggregation import artifact_store, final_model_bytes, run_aggregation
from marketplace.rounds.models import Round, TaskResult
from marketplace.rounds.sizing import measurement, plan_key
from tests.marketplace.helpers import SMALL_SPEC
from trainer.adapt.health import health
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

State = dict[str, torch.Tensor]


def _spec(**sections: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["rounds"] = {"max_rounds": 1}
    spec["aggregation"] = {"strategy": "fedavg", "weighting": "health"}
    return spec | sections


def _work_round_one(monkeypatch, agents, job_id: str) -> Round:
    """Every agent uploads its round-1 update; the aggregation is held back (as a queue would
    hold it) so the test can set the nodes' records first. Returns the aggregating round."""
    held: list[int] = []
    monkeypatch.setattr(tasks.aggregate_round, "delay", held.append)
    for agent in agents:
        assert agent.work(agent.claim()).status_code == 202
    rnd = Round.objects.get(job_id=job_id, number=1)
    assert rnd.status == "aggregating" and held == [rnd.pk]
    return rnd


def _sent(rnd: Round) -> list[tuple[str, int, State]]:
    """(node id, num_samples, delta as uploaded) of the round's updates."""
    results = TaskResult.objects.filter(task__round=rnd).select_related("task__shard")
    return [
        (str(r.node_id), r.num_samples, decode_state(files.get(r.update_file))[0])
        for r in sorted(results, key=lambda r: r.task.shard.index)
    ]


def _mean(
    start: State, sent: list[tuple[str, int, State]], weight: Callable[[str, int], float]
) -> State:
    total = sum(weight(nid, n) for nid, n, _ in sent)
    return {
        k: start[k] + sum(weight(nid, n) * d[k].double() for nid, n, d in sent).float() / total
        for k in start
    }


def _record_health(nodes: list[Node], spec: dict[str, Any]) -> dict[str, float]:
    """The policy's scores from the nodes' records, computed here as plan_round does."""
    parsed = parse_spec(spec)
    measured = {str(n.pk): measurement(n, parsed) for n in nodes}
    ref_step = statistics.median(m.step_s for m in measured.values())
    return {nid: health(m, ref_step).score for nid, m in measured.items()}


def _assert_verifies(buyer, job_id: str) -> ProvenanceChain:
    chain = ProvenanceChain.from_json(buyer.get(f"/api/v1/jobs/{job_id}/provenance").content)
    spec = parse_spec(Job.objects.get(pk=job_id).spec)
    assert verify_with_artifacts(chain, artifact_store(), spec.aggregation).ok
    return chain


def test_the_model_is_the_health_weighted_fedavg_of_the_updates(
    make_agent, submit, buyer, monkeypatch
) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = _spec()
    job = submit(spec, tier="platform")
    rnd = _work_round_one(monkeypatch, agents, job["id"])
    # one node with a poor record: half its leases lost, a third of its updates rejected
    Node.objects.filter(pk=agents[0].node_id).update(
        verified_ok=4, verified_bad=2, lost_leases=6, reliability=0.3
    )
    Node.objects.filter(pk=agents[1].node_id).update(verified_ok=9, lost_leases=1)
    nodes = list(Node.objects.filter(pk__in=[a.node_id for a in agents]))
    scores = _record_health(nodes, spec)
    assert scores[str(agents[0].node_id)] < scores[str(agents[1].node_id)] - 0.1

    run_aggregation(rnd.pk)

    stored = Job.objects.get(pk=job["id"])
    assert stored.status == "completed"
    model, _ = decode_state(final_model_bytes(stored))
    start, sent = load_model_file(rnd.input_model_file), _sent(rnd)
    assert len(sent) == 3
    weighted = _mean(start, sent, lambda nid, n: n * scores[nid])
    plain = _mean(start, sent, lambda nid, n: n)
    for k in start:
        torch.testing.assert_close(model[k], weighted[k], rtol=1e-4, atol=1e-6)
    assert max((model[k] - plain[k]).abs().max().item() for k in start) > 1e-4

    rnd.refresh_from_db()
    assert rnd.metrics["weighting"] == "health" and rnd.metrics["participants"] == 3
    assert rnd.metrics["health"] == {nid: round(s, 4) for nid, s in scores.items()}
    chain = _assert_verifies(buyer, job["id"])  # the weighted round replays
    recorded = {c.node_id: c.metrics["health"] for c in chain.records[0].contributions}
    assert recorded == pytest.approx(scores)


def test_an_adaptive_job_weighs_by_the_health_in_the_rounds_plan(
    make_agent, submit, buyer, monkeypatch
) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = _spec(adaptation={"enabled": True, "max_local_steps": 40, "min_local_steps": 2})
    job = submit(spec, tier="platform")
    rnd = _work_round_one(monkeypatch, agents, job["id"])
    assert {plan_key(a.node_id) for a in agents} <= rnd.plan.keys()
    # the plan's scores win over the records (which would score these fresh nodes alike)
    planned = {str(a.node_id): h for a, h in zip(agents, (0.2, 0.9, 0.6), strict=True)}
    plan = {key: dict(entry) for key, entry in rnd.plan.items()}
    for nid, h in planned.items():
        plan[plan_key(nid)]["health"] = h
    Round.objects.filter(pk=rnd.pk).update(plan=plan)

    run_aggregation(rnd.pk)

    rnd.refresh_from_db()
    assert rnd.status == "done" and rnd.metrics["weighting"] == "health"
    assert rnd.metrics["health"] == planned
    # the recorded (aggregated) updates are the sent ones scaled to num_samples x health
    sent = _sent(rnd)
    samples = sum(n for _, n, _ in sent)
    weight = sum(n * planned[nid] for nid, n, _ in sent)
    chain = _assert_verifies(buyer, job["id"])
    contributions = {c.node_id: c for c in chain.records[0].contributions}
    for nid, _, delta in sent:
        recorded = artifact_store().get_state(contributions[nid].update_hash)
        factor = planned[nid] * samples / weight
        for k, v in delta.items():
            torch.testing.assert_close(recorded[k], v * factor)


def test_a_samples_weighted_job_records_its_weighting(make_agent, submit, monkeypatch) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(_spec(aggregation={"strategy": "fedavg"}), tier="platform")
    rnd = _work_round_one(monkeypatch, agents, job["id"])
    run_aggregation(rnd.pk)
    rnd.refresh_from_db()
    assert rnd.metrics["weighting"] == "samples" and "health" not in rnd.metrics


@pytest.mark.parametrize("strategy", ["median", "trimmed_mean", "krum"])
def test_health_weighting_with_a_robust_strategy_is_refused_naming_the_field(
    buyer, strategy: str
) -> None:
    aggregation: Mapping[str, Any] = {"strategy": strategy, "weighting": "health"}
    if strategy == "krum":
        aggregation = {**aggregation, "byzantine": 0}  # 3 shards are enough for krum itself
    body = {"spec": _spec(aggregation=aggregation), "max_price_per_gpu_hour": "1", "budget": "1"}
    response = buyer.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["error"] == "invalid_spec"
    assert [p["field"] for p in data["problems"]] == ["aggregation.weighting"]
    assert strategy in data["problems"][0]["reason"] and "aggregation.weighting" in data["detail"]
    assert not Job.objects.exists()
