"""A test stand-in for the desktop agent: the agent API over Django's test client, with real
local training (trainer.local.train_local), optionally cheating."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from django.db import connection
from rest_framework.test import APIClient

from trainer.compression import CodecConfig, encode_update
from trainer.datasets import Dataset
from trainer.local import LocalResult, train_local
from trainer.models import build_model
from trainer.scoring import Predictions, ScoreSums, predict, score
from trainer.spec import JobSpec, parse_spec
from trainer.updates import decode_state, encode_state


class Agent:
    def __init__(self, client: APIClient, node_id: int, key: str) -> None:
        self.client = client
        self.node_id = node_id
        self.key = key
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    def heartbeat(self, state: str = "idle", **extra: Any) -> Any:
        body = {"state": state, "metrics": {"gpu_util": 0.5}, "network": {"rtt_ms": 20}} | extra
        return self.client.post("/api/v1/agent/heartbeat", body, format="json")

    def claim(self, wait: float = 0) -> dict[str, Any] | None:
        response = self.client.post(f"/api/v1/agent/claim?wait={wait}")
        if response.status_code == 204:
            return None
        assert response.status_code == 200, response.content
        return response.json()["task"]

    def model(self, task_id: str) -> Any:
        return self.client.get(f"/api/v1/agent/tasks/{task_id}/model")

    def shard(self, task_id: str) -> Any:
        return self.client.get(f"/api/v1/agent/tasks/{task_id}/shard")

    def program(self, task: dict[str, Any], spec: JobSpec) -> JobSpec:
        """An exported model's spec with its program fetched to a file, as the real agent
        puts it in the task's folder."""
        if not task.get("program"):
            return spec
        response = self.client.get(f"/api/v1/agent/tasks/{task['id']}/program")
        assert response.status_code == 200, response.content
        folder = Path(tempfile.mkdtemp(prefix="gpuflex-program-"))
        path = folder / "program.pt2"
        path.write_bytes(response.content)
        return spec.replace(model=spec.model.model_dump(mode="json") | {"program": str(path)})

    def local_result(self, task: dict[str, Any], precision: str | None = None) -> LocalResult:
        """What the real agent's runner does: download, train_local with the task's seed (in
        `precision` when given: bf16 autocast on a CPU stands in for a GPU's bf16)."""
        state, meta = decode_state(self.model(task["id"]).content)
        tensors, _ = decode_state(self.shard(task["id"]).content)
        spec = self.program(task, parse_spec(task["spec"]))
        if precision is not None:
            spec = spec.replace(local=spec.local.model_dump() | {"precision": precision})
        input_shape = tuple(json.loads(meta["input_shape"]))
        num_classes = int(meta["num_classes"])
        model = build_model(spec.model, input_shape, num_classes, seed=spec.seed)
        x, y = tensors["x"], tensors["y"]
        data = Dataset("shard", meta["task"], x, y, x[:0], y[:0], num_classes, input_shape)
        return train_local(
            model,
            state,
            data,
            spec,
            seed=task["seed"],
            steps=task["steps"],
            batch_size=task["batch_size"],
            proximal_mu=task["proximal_mu"],
            lr=task.get("lr"),
        )

    def score(self, task: dict[str, Any]) -> tuple[bytes, dict[str, float]]:
        """An evaluate or inference task, as the runner's run_scoring does it."""
        state, meta = decode_state(self.model(task["id"]).content)
        tensors, _ = decode_state(self.shard(task["id"]).content)
        spec = parse_spec(task["spec"])
        shape = tuple(json.loads(meta["input_shape"]))
        model = build_model(spec.model, shape, int(meta["num_classes"]), seed=spec.seed)
        model.load_state_dict(state)
        x, y = tensors["x"], tensors["y"]
        metrics = {"samples": int(x.shape[0]), "compute_s": 1.0}
        if task["kind"] == "evaluate":
            return score(model, x, y, meta["task"]).to_bytes(), metrics
        return predict(model, x).to_bytes(), metrics

    def train(self, task: dict[str, Any]) -> tuple[bytes, dict[str, float]]:
        """The agent's whole task: train (local_result), then encode the delta; a scoring
        task's sums or predictions instead."""
        if task["kind"] != "train":
            return self.score(task)
        result = self.local_result(task)
        metrics = {
            "loss": result.loss,
            "steps": result.steps,
            "samples": result.num_samples,
            "compute_s": 2.0,
        }
        codec = CodecConfig(task["codec"])  # whatever the server's sizing chose for this task
        return encode_update(result.delta, codec), metrics

    def upload(self, task_id: str, payload: bytes, metrics: dict[str, float] | None = None) -> Any:
        """The upload, and then the worker's check of it (rounds.update_checks): a
        transactional test has run it already, on the request's commit (Celery is eager in
        tests); a test inside a transaction never commits, so it runs here, as the commit
        would have sent it."""
        response = self.client.put(
            f"/api/v1/agent/tasks/{task_id}/update",
            data=payload,
            content_type="application/octet-stream",
            HTTP_X_GPUFLEX_METRICS=json.dumps(metrics or {}),
        )
        if response.status_code == 202 and connection.in_atomic_block:
            from marketplace.rounds.update_checks import check_received

            check_received(task_id)
        return response

    def work(self, task: dict[str, Any], cheat: bool = False) -> Any:
        payload, metrics = self.train(task)
        if cheat and task["kind"] == "inference":  # made-up predictions of the right shape
            real = decode_state(payload)[0]
            gen = torch.Generator().manual_seed(self.node_id)
            probs = torch.rand(real["probs"].shape, generator=gen)
            payload = Predictions(probs.argmax(-1), probs / probs.sum(-1, keepdim=True)).to_bytes()
        elif cheat and task["kind"] == "evaluate":  # every row called right
            real = ScoreSums.from_bytes(payload)
            payload = ScoreSums(real.partials, real.count, real.count).to_bytes()
        elif cheat:  # a random update of plausible size instead of real work
            state, _ = decode_state(payload)
            gen = torch.Generator().manual_seed(self.node_id)
            fake = {k: torch.randn(v.shape, generator=gen) * 0.05 for k, v in state.items()}
            payload = encode_state(fake)
        return self.upload(task["id"], payload, metrics)
