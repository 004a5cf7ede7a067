"""Federated mode: nodes holding a named local dataset train on it; it never leaves them."""

from __future__ import annotations

import json

import pytest
import torch

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import tick
from marketplace.rounds.models import Task, TaskResult
from marketplace.rounds.scheduling import lease_batch
from tests.marketplace.helpers import SMALL_SPEC
from trainer.datasets import load_digits_dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.provenance import ProvenanceChain
from trainer.sharding import plan_shards
from trainer.spec import parse_spec
from trainer.updates import decode_state, encode_state

pytestmark = pytest.mark.django_db(transaction=True)

FEDERATED_SPEC = SMALL_SPEC | {
    "sharding": {"method": "prepartitioned"},
    "local": {"steps": 5, "batch_size": 32},
}

# a silo declares its dataset's rows: its updates' sample counts are checked against them
CLINIC = [{"name": "clinic", "rows": 1797}]


def silo_data(count: int):
    """Each silo's private rows (the server never sees them)."""
    full = load_digits_dataset(0.2, 1)
    shards = plan_shards(full, count, method="random", seed=1)
    return [full.subset(torch.from_numpy(s.indices)) for s in shards]


def train_on_silo(agent, task, data):
    state, meta = decode_state(agent.model(task["id"]).content)
    spec = parse_spec(task["spec"])
    shape, classes = tuple(json.loads(meta["input_shape"])), int(meta["num_classes"])
    model = build_model(spec.model, shape, classes, seed=spec.seed)
    result = train_local(
        model, state, data, spec, seed=task["seed"], steps=task["steps"],
        batch_size=task["batch_size"],
    )  # fmt: skip
    metrics = {"loss": result.loss, "samples": result.num_samples, "compute_s": 0.5}
    return agent.upload(task["id"], encode_state(result.delta), metrics)


def submit_federated(buyer, **fields):
    body = {
        "spec": FEDERATED_SPEC,
        "max_price_per_gpu_hour": "1",
        "budget": "10",
        "federated_dataset": "clinic",
        "tier": "volunteer",
    } | fields
    response = buyer.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_silos_train_on_their_own_data(make_agent, buyer) -> None:
    silos = [make_agent(local_datasets=CLINIC) for _ in range(2)]
    outsider = make_agent()
    job = submit_federated(buyer)
    assert job["federated_dataset"] == "clinic"
    assert Task.objects.count() == 2  # one per silo, reserved for it
    assert outsider.claim() is None
    assert lease_batch(list(Node.objects.all()), slots=2) == 0  # never bulk-assigned away

    data = silo_data(2)
    for _ in range(2):  # rounds
        for agent, local in zip(silos, data, strict=True):
            task = agent.claim()
            assert task["local_dataset"] == "clinic" and task["shard_hash"] is None
            shard = agent.shard(task["id"])
            assert shard.status_code == 409 and shard.json()["error"] == "local_dataset"
            assert train_on_silo(agent, task, local).status_code == 202  # received, checked

    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed" and done.rounds_done == 2
    results = TaskResult.objects.all()
    assert results.count() == 4 and all(r.verified is None and r.credited for r in results)
    assert {r.num_samples for r in results} == {d.num_train for d in data}
    chain = ProvenanceChain.from_json(buyer.get(f"/api/v1/jobs/{job['id']}/provenance").content)
    labels = {c.shard_hash for r in chain for c in r.contributions}
    assert labels == {f"local:clinic:{a.node_id}" for a in silos}


def test_federated_update_must_report_samples(make_agent, buyer) -> None:
    silo = make_agent(local_datasets=CLINIC)
    submit_federated(buyer)
    task = silo.claim()
    state, _ = decode_state(silo.model(task["id"]).content)
    zero = encode_state({k: torch.zeros_like(v) for k, v in state.items()})
    response = silo.upload(task["id"], zero, {"loss": 1.0})
    assert response.status_code == 400 and "samples" in response.json()["detail"]
    assert not TaskResult.objects.exists()


def test_silo_coming_online_joins_the_open_round(make_agent, buyer) -> None:
    first = make_agent(local_datasets=CLINIC)
    submit_federated(buyer)
    assert Task.objects.count() == 1
    late = make_agent(local_datasets=CLINIC)
    assert late.claim() is None  # not part of this round yet
    assert tick()["silos"] == 1
    assert late.claim()["local_dataset"] == "clinic"
    assert first.claim() is not None


def test_federated_spec_rules(make_agent, buyer) -> None:
    response = buyer.post(
        "/api/v1/jobs/",
        {
            "spec": SMALL_SPEC,
            "max_price_per_gpu_hour": "1",
            "budget": "10",
            "federated_dataset": "clinic",
        },
        format="json",
    )
    assert response.status_code == 400
    fields = {p["field"] for p in response.json()["problems"]}
    assert fields == {"sharding.method"}
    epochs = FEDERATED_SPEC | {"local": {"epochs": 1}}
    response = buyer.post(
        "/api/v1/jobs/",
        {
            "spec": epochs,
            "max_price_per_gpu_hour": "1",
            "budget": "10",
            "federated_dataset": "clinic",
        },
        format="json",
    )
    assert {p["field"] for p in response.json()["problems"]} == {"local.steps"}
    plain = buyer.post(
        "/api/v1/jobs/",
        {"spec": FEDERATED_SPEC, "max_price_per_gpu_hour": "1", "budget": "10"},
        format="json",
    )
    assert plain.status_code == 400  # prepartitioned data needs the silos' name
