"""Claim, download and upload from the agent's side, and every way an upload is refused."""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from django.conf import settings

from marketplace.rounds.models import ReceivedUpdate, Task, TaskResult, TaskStatus
from tests.marketplace.helpers import SMALL_SPEC
from trainer.updates import decode_state, encode_state


@pytest.fixture
def leased(make_agent, submit):
    """A platform job with one task leased to `agent`; returns (agent, task, honest payload)."""
    agent = make_agent(kind="platform")
    submit(tier="platform")
    task = agent.claim()
    payload, _ = agent.train(task)
    return agent, task, payload


def test_claim_returns_the_documented_task(leased) -> None:
    _, task, _ = leased
    assert set(task) == {
        "id", "job_id", "round", "kind", "spec", "steps", "batch_size", "seed", "codec",
        "proximal_mu", "deadline", "model_hash", "model_source", "shard_hash", "overlap",
        "footprint", "lr",
    }  # fmt: skip
    assert task["kind"] == "train" and task["round"] == 1 and task["codec"] == "none"
    assert task["spec"]["name"] == SMALL_SPEC["name"] and task["steps"] == 8


def test_downloads_are_safetensors_of_the_task(leased) -> None:
    agent, task, _ = leased
    tensors, _ = decode_state(agent.shard(task["id"]).content)
    assert set(tensors) == {"x", "y"}
    db_task = Task.objects.select_related("shard").get(pk=task["id"])
    assert tensors["x"].shape[0] == db_task.shard.size  # only its own shard
    from trainer.hashing import state_hash

    assert state_hash(tensors) == task["shard_hash"]
    state, meta = decode_state(agent.model(task["id"]).content)
    assert state_hash(state) == task["model_hash"]
    assert json.loads(meta["input_shape"]) == [64] and meta["num_classes"] == "10"


def test_claim_with_nothing_to_do_is_204(make_agent) -> None:
    response = make_agent().client.post("/api/v1/agent/claim?wait=0.2")
    assert response.status_code == 204


def test_claim_wait_is_bounded(make_agent) -> None:
    response = make_agent().client.post("/api/v1/agent/claim?wait=31")
    assert response.status_code == 400
    assert "wait" in response.json()["detail"]


def refused_in_request(response, reason: str) -> None:
    """What the header alone shows is refused by the web process, the problem named."""
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["error"] == "update_rejected" and body["reason"] == reason
    assert body["detail"]
    assert TaskResult.objects.count() == 0 and ReceivedUpdate.objects.count() == 0


def rejected(response, task_id: str, reason: str) -> str:
    """Received (202), then refused by the worker's check: the task is released as a refused
    upload's lease always ended, with the reason on it; returns that reason."""
    assert response.status_code == 202, response.content
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.PENDING and task.node_id is None
    assert task.last_error.startswith(f"upload refused ({reason}): The update was rejected")
    assert TaskResult.objects.count() == 0 and ReceivedUpdate.objects.count() == 0
    return task.last_error


def test_wrong_shape_update_is_refused_in_the_request(leased) -> None:
    agent, task, payload = leased
    state, _ = decode_state(payload)
    name = next(iter(state))
    state[name] = torch.zeros(3, 3)
    response = agent.upload(task["id"], encode_state(state))
    refused_in_request(response, "shape")  # the header shows it: no torch needed
    assert f"tensor '{name}' has shape [3, 3]" in response.json()["detail"]


def test_nan_update_is_refused(leased) -> None:
    agent, task, payload = leased
    state, _ = decode_state(payload)
    name = next(iter(state))
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    response = agent.upload(task["id"], encode_state(state))
    assert name in rejected(response, task["id"], "non_finite")


def test_missing_tensor_is_refused_in_the_request(leased) -> None:
    agent, task, payload = leased
    state, _ = decode_state(payload)
    name = next(iter(state))
    state.pop(name)
    response = agent.upload(task["id"], encode_state(state))
    refused_in_request(response, "missing_keys")
    assert repr(name) in response.json()["detail"]


def test_huge_norm_update_is_refused(leased) -> None:
    agent, task, payload = leased
    state, _ = decode_state(payload)
    huge = encode_state({k: v + 1e6 for k, v in state.items()})
    rejected(agent.upload(task["id"], huge), task["id"], "norm")


def test_garbage_bytes_are_422_in_the_request(leased) -> None:
    agent, task, _ = leased
    response = agent.upload(task["id"], b"\x00" * 64)
    refused_in_request(response, "corrupt")
    assert "not a safetensors file" in response.json()["detail"]
    # nothing was received: the lease is the node's still
    assert Task.objects.get(pk=task["id"]).status == TaskStatus.LEASED


def test_oversized_upload_is_413(leased) -> None:
    agent, task, _ = leased
    body = b"\x00" * (settings.GPUFLEX["MAX_UPDATE_BYTES"] + 1)
    response = agent.upload(task["id"], body)
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
    assert TaskResult.objects.count() == 0


def test_bad_metrics_header_is_400(leased) -> None:
    agent, task, payload = leased
    response = agent.client.put(
        f"/api/v1/agent/tasks/{task['id']}/update",
        data=payload,
        content_type="application/octet-stream",
        HTTP_X_GPUFLEX_METRICS="{not json",
    )
    assert response.status_code == 400
    assert "X-GPUFlex-Metrics" in response.json()["detail"]
    assert TaskResult.objects.count() == 0


def test_a_rejected_update_can_be_followed_by_a_good_one(leased) -> None:
    agent, task, payload = leased
    assert agent.upload(task["id"], b"junk").status_code == 422
    assert agent.upload(task["id"], payload).status_code == 202


def test_fail_puts_the_task_back_for_another_node(leased, make_agent) -> None:
    agent, task, _ = leased
    response = agent.client.post(
        f"/api/v1/agent/tasks/{task['id']}/fail",
        {"reason": "oom", "detail": "CUDA OOM"},
        format="json",
    )
    assert response.status_code == 200
    db_task = Task.objects.get(pk=task["id"])
    assert db_task.status == "pending" and db_task.node is None and "oom" in db_task.last_error
    assert agent.upload(task["id"], b"x").status_code == 404


def test_fail_with_unknown_reason_is_400(leased) -> None:
    agent, task, _ = leased
    response = agent.client.post(
        f"/api/v1/agent/tasks/{task['id']}/fail", {"reason": "bored"}, format="json"
    )
    assert response.status_code == 400


def test_unknown_task_id_is_404(make_agent) -> None:
    agent = make_agent()
    for path in ("model", "shard"):
        assert agent.client.get(f"/api/v1/agent/tasks/{uuid.uuid4()}/{path}").status_code == 404
    assert agent.client.get("/api/v1/agent/tasks/not-a-uuid/model").status_code == 404


def test_reported_compute_time_is_capped_by_the_lease(leased) -> None:
    agent, task, payload = leased
    assert agent.upload(task["id"], payload, {"compute_s": 1e9, "loss": 1.0}).status_code == 202
    result = TaskResult.objects.select_related("task").get()
    held = (result.created_at - result.task.leased_at).total_seconds()
    assert 0 <= result.compute_s <= held + 1e-3
    assert result.metrics == {"compute_s": 1e9, "loss": 1.0}


def test_a_claim_leases_a_batch_of_distinct_units(make_agent, submit) -> None:
    """`claim?max=N`: up to N tasks in one claim, each leased once, never two replicas of
    one unit to one node; `task` is the first of `tasks`."""
    agent = make_agent(kind="volunteer")  # untrusted: each lease adds a replica to verify
    submit(tier="hybrid")
    response = agent.client.post("/api/v1/agent/claim?max=8")
    assert response.status_code == 200, response.content
    body = response.json()
    tasks = body["tasks"]
    assert body["task"] == tasks[0] and len(tasks) == 3  # three shards, one unit each
    leased = Task.objects.filter(pk__in=[t["id"] for t in tasks])
    assert {t.status for t in leased} == {"leased"} and {t.node_id for t in leased} == {
        agent.node_id
    }
    assert len({(t.round_id, t.shard_id) for t in leased}) == 3
    assert Task.objects.filter(replica__gt=0, status="pending").count() == 3  # for others
    assert agent.claim() is None  # the replicas are never this node's


def test_a_claim_batch_is_bounded(make_agent) -> None:
    response = make_agent().client.post("/api/v1/agent/claim?max=9")
    assert response.status_code == 400 and "max" in response.json()["detail"]
