"""Scoring jobs through the marketplace: `kind: evaluate` and `kind: inference`, split into
tasks of rows that agents score (tests/marketplace/agents.py does what the runner does)."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.ledger.metering import Rules, per_sample, seconds_per_sample
from marketplace.ledger.models import Transaction, TxKind
from marketplace.ledger.observed_speed import job_parameters
from marketplace.nodes.models import Node
from marketplace.rounds.maintenance import reclaim_leases
from marketplace.rounds.models import Task, TaskResult
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle
from trainer.datasets import load_dataset
from trainer.models import build_model
from trainer.scoring import evaluate_rows, in_row_order, predict
from trainer.spec import DatasetSpec, ModelSpec
from trainer.updates import decode_state

pytestmark = pytest.mark.django_db(transaction=True)

DIGITS = DatasetSpec(kind="digits")


def _reference(model_bytes: bytes, model_spec: ModelSpec):
    """One process scoring every row of digits with the model: what the job must equal."""
    state, _ = decode_state(model_bytes)
    model = build_model(model_spec, (64,), 10, seed=0)
    model.load_state_dict(state)
    return evaluate_rows(model, load_dataset(DIGITS, seed=0))


def test_evaluating_a_finished_job_equals_one_process_exactly(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    trained = submit(tier="platform")
    run_until_idle(agents)
    spec = {"name": "eval", "kind": "evaluate", "source": {"job": trained["id"]},
            "dataset": {"kind": "digits"}, "sharding": {"num_shards": 5}}  # fmt: skip
    job = submit(spec, tier="platform")
    assert job["spec"]["model"] == trained["spec"]["model"]  # the source job's model
    assert run_until_idle(agents) == 5  # 1797 rows in 5 tasks of whole 256-row batches

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["kind"] == "evaluate"
    result = detail["result"]
    reference = _reference(buyer.get(f"/api/v1/jobs/{trained['id']}/model").content,
                           ModelSpec(**trained["spec"]["model"]))  # fmt: skip
    assert result["total"] == reference.count == 1797
    assert result["correct"] == reference.correct
    assert result["loss_sum"] == reference.loss_sum  # exactly, not approximately
    assert result["loss"] == reference.evaluation.loss
    assert result["accuracy"] == reference.evaluation.accuracy
    assert detail["stop_reason"] == "evaluated 1797 samples"
    page = _web(job["id"]).get(f"/jobs/{job['id']}/").content.decode()
    assert f"({reference.correct} of 1797)" in page and "Evaluation" in page
    # paid as any verified work is
    assert TaskResult.objects.filter(task__round__job=job["id"], credited=True).count() == 5


def test_evaluating_an_uploaded_checkpoint_on_volunteers_catches_a_cheat(make_agent, buyer) -> None:
    model_spec = ModelSpec(arch="mlp", hidden=[16])
    state = build_model(model_spec, (64,), 10, seed=7).state_dict()
    spec = {"name": "eval-upload", "kind": "evaluate", "dataset": {"kind": "digits"},
            "model": {"arch": "mlp", "hidden": [16], "checkpoint": "mine.safetensors"},
            "sharding": {"num_shards": 3}}  # fmt: skip
    body = {"spec": json.dumps(spec), "max_price_per_gpu_hour": "1.00", "budget": "10",
            "tier": "volunteer",
            "model_checkpoint": SimpleUploadedFile("mine.safetensors",
                                                   safetensors.torch.save(state))}  # fmt: skip
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 201, response.content
    job = response.json()
    agents = [make_agent() for _ in range(4)]
    cheat = agents[0]
    run_until_idle(agents, cheaters=(cheat,))

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed", detail
    reference = evaluate_rows(_model(model_spec, state), load_dataset(DIGITS, seed=0))
    assert detail["result"]["correct"] == reference.correct
    assert detail["result"]["loss_sum"] == reference.loss_sum
    rejected = TaskResult.objects.filter(task__round__job=job["id"], node=cheat.node_id)
    assert rejected.exists() and not rejected.filter(accepted=True).exists()
    node = Node.objects.get(pk=cheat.node_id)
    assert node.verified_bad >= 1 and node.reliability < 1


def _web(job_id: str) -> Client:
    """The job page, logged in as its buyer."""
    web = Client()
    web.force_login(Job.objects.get(pk=job_id).buyer)
    return web


def _model(spec: ModelSpec, state):
    model = build_model(spec, (64,), 10, seed=0)
    model.load_state_dict(state)
    return model


def test_a_scoring_job_needs_a_finished_model_of_the_buyers_own(submit, buyer, make_user) -> None:
    bad = buyer.post("/api/v1/jobs/", {"spec": {"name": "e", "kind": "evaluate"},
                     "max_price_per_gpu_hour": "1.00", "budget": "10"}, format="json")  # fmt: skip
    assert bad.status_code == 400 and "one of the two" in bad.json()["detail"]
    running = submit(SMALL_SPEC | {"rounds": {"max_rounds": 5}})
    spec = {"name": "e", "kind": "evaluate", "source": {"job": running["id"]}}
    early = buyer.post("/api/v1/jobs/", {"spec": spec, "max_price_per_gpu_hour": "1.00",
                       "budget": "10"}, format="json")  # fmt: skip
    assert early.status_code == 400
    assert "source.job" in early.json()["detail"] and "no final model" in early.json()["detail"]
    _, key = make_user("buyer")
    from tests.marketplace.helpers import client_for

    other = client_for(key).post("/api/v1/jobs/", {"spec": spec, "max_price_per_gpu_hour": "1.00",
                                 "budget": "10"}, format="json")  # fmt: skip
    assert other.status_code == 400 and "you have no job with this id" in other.json()["detail"]
    assert Job.objects.count() == 1  # nothing half-stored


def _checkpoint_job(buyer, kind: str, tier: str, shards: int) -> dict:
    model_spec = ModelSpec(arch="mlp", hidden=[16])
    state = build_model(model_spec, (64,), 10, seed=7).state_dict()
    spec = {"name": f"{kind}-upload", "kind": kind, "dataset": {"kind": "digits"},
            "model": {"arch": "mlp", "hidden": [16], "checkpoint": "mine.safetensors"},
            "sharding": {"num_shards": shards}}  # fmt: skip
    body = {"spec": json.dumps(spec), "max_price_per_gpu_hour": "1.00", "budget": "10",
            "tier": tier,
            "model_checkpoint": SimpleUploadedFile("mine.safetensors",
                                                   safetensors.torch.save(state))}  # fmt: skip
    response = buyer.post("/api/v1/jobs/", body, format="multipart")
    assert response.status_code == 201, response.content
    return response.json() | {"model": _model(model_spec, state)}


def test_inference_predictions_come_back_whole_and_in_order_when_a_node_dies(
    make_agent, buyer
) -> None:
    job = _checkpoint_job(buyer, "inference", "platform", shards=4)
    agents = [make_agent(kind="platform") for _ in range(3)]
    # a node takes a task and dies with it: nothing comes back before its lease runs out
    dead = agents[0]
    lost = dead.claim()
    assert lost is not None and lost["kind"] == "inference"
    payload, metrics = dead.train(lost)  # it got as far as its predictions
    Task.objects.filter(pk=lost["id"]).update(lease_expires=timezone.now() - timedelta(seconds=1))
    assert reclaim_leases() == 1
    run_until_idle(agents[1:])
    # back from the dead, it uploads the task it no longer holds: refused, nothing doubled
    late = dead.upload(lost["id"], payload, metrics)
    assert late.status_code in (404, 409), late.content

    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["kind"] == "inference"
    assert detail["result"]["rows"] == 1797
    download = buyer.get(detail["result"]["predictions"])
    assert download.status_code == 200
    table = pq.read_table(io.BytesIO(download.content))
    assert table.column("row").to_pylist() == list(range(1797))  # every row once, in order
    x, _ = in_row_order(load_dataset(DIGITS, seed=0))
    expected = predict(job["model"], x)
    assert table.column("prediction").to_pylist() == expected.labels.tolist()
    assert torch.equal(torch.tensor(table.column("prob_3").to_pylist()), expected.probs[:, 3])

    web = _web(job["id"])
    assert "1797 rows predicted" in web.get(f"/jobs/{job['id']}/").content.decode()
    assert web.get(f"/jobs/{job['id']}/predictions/").content == download.content

    # charged per sample processed: each row once, at the ledger's per-sample meter
    charges = Transaction.objects.filter(job_id=job["id"], kind=TxKind.CHARGE)
    results = TaskResult.objects.filter(task__round__job=job["id"], credited=True)
    assert sum(r.num_samples for r in results) == 1797 and charges.count() == results.count()
    rules = Rules.from_settings()
    for tx in charges.select_related("task_result"):
        floor = settings.GPUFLEX["INFERENCE_MIN_S_PER_SAMPLE"]
        sps = seconds_per_sample(job_parameters(tx.job), rules, floor)
        expected_gross = per_sample(samples=tx.task_result.num_samples, seconds_per_sample=sps,
                                    price_per_hour=Decimal("0.40"), rules=rules).gross  # fmt: skip
        assert Decimal(tx.details["gross"]) == expected_gross > 0


def test_inference_replicas_catch_made_up_predictions(make_agent, buyer) -> None:
    job = _checkpoint_job(buyer, "inference", "volunteer", shards=3)
    agents = [make_agent() for _ in range(4)]
    cheat = agents[1]
    run_until_idle(agents, cheaters=(cheat,))
    assert Job.objects.get(pk=job["id"]).status == "completed"
    theirs = TaskResult.objects.filter(task__round__job=job["id"], node=cheat.node_id)
    assert theirs.exists() and not theirs.filter(accepted=True).exists()
    assert Node.objects.get(pk=cheat.node_id).verified_bad >= 1
    table = pq.read_table(io.BytesIO(buyer.get(f"/api/v1/jobs/{job['id']}/predictions").content))
    x, _ = in_row_order(load_dataset(DIGITS, seed=0))
    assert table.column("prediction").to_pylist() == predict(job["model"], x).labels.tolist()


def test_rows_no_node_could_score_fail_the_job_saying_so(make_agent, buyer) -> None:
    job = _checkpoint_job(buyer, "evaluate", "platform", shards=2)
    good, bad = make_agent(kind="platform"), make_agent(kind="platform")
    first = good.claim()
    assert good.work(first).status_code == 202
    for _ in range(10):  # the other unit fails on every attempt until it is given up
        task = bad.claim()
        if task is None:
            break
        reply = bad.client.post(f"/api/v1/agent/tasks/{task['id']}/fail",
                                {"reason": "crashed", "detail": "boom"}, format="json")  # fmt: skip
        assert reply.status_code in (200, 204), reply.content
    stored = Job.objects.get(pk=job["id"])
    assert stored.status == "failed"
    assert "1 of the 2 units of rows could not be scored" in stored.error
    assert TaskResult.objects.get(task__round__job=job["id"]).node_id == good.node_id
