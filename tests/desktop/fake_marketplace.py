"""A protocol test double for docs/agent-api.md, on 127.0.0.1, for the agent's unit tests.

Minimal but strict where the agent could go wrong: keys, leases (a task is served only to the
node holding it), update validation with trainer.updates, idempotent uploads (same bytes 200,
other bytes 409). Faults on demand: `fail_next(n, 503)` answers with errors, `drop_next(n)`
closes connections without answering.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch

from trainer.datasets import load_dataset
from trainer.hashing import state_hash
from trainer.models import build_model
from trainer.spec import parse_spec
from trainer.updates import UpdateRejected, decode_update, encode_state

PROVIDER_KEY = "gfx_u_test"


@dataclass
class FakeTask:
    task: dict[str, Any]
    model: bytes
    shard: bytes
    reference: dict[str, torch.Tensor]
    leased_to: str | None = None
    accepted: bytes | None = None
    failed: list[dict[str, Any]] = field(default_factory=list)
    corrupt_models: int = 0  # serve this many model downloads with a flipped data byte
    model_gets: int = 0
    # what GET …/update answers once an upload was received to be checked later (see
    # FakeMarketplace.check_later); None: nothing received
    outcome: dict[str, Any] | None = None


def digits_task(
    task_id: str, steps: int = 20, rows: int = 200, seed: int = 1, **spec_extra: Any
) -> FakeTask:
    spec = parse_spec(
        {"name": "digits-mlp", "model": {"arch": "mlp", "hidden": [32]},
         "optimizer": {"name": "sgd", "lr": 0.2}, "local": {"steps": steps, "batch_size": 32}}
        | spec_extra
    )  # fmt: skip
    data = load_dataset(spec.dataset)
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=spec.seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shard = {"x": data.x_train[:rows], "y": data.y_train[:rows]}
    task = {
        "id": task_id, "job_id": "job-1", "round": 1, "kind": "train", "spec": spec.to_dict(),
        "steps": steps, "batch_size": 32, "seed": seed, "codec": "none", "proximal_mu": 0.0,
        "deadline": "2099-01-01T00:00:00Z",
        "model_hash": state_hash(state), "shard_hash": state_hash(shard),
    }  # fmt: skip
    return FakeTask(task, encode_state(state), encode_state(shard), state)


class FakeMarketplace:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, str] = {}  # node key -> node id
        self.queue: list[str] = []
        self.tasks: dict[str, FakeTask] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.heartbeats: list[dict[str, Any]] = []
        self.claims = 0
        self.puts: list[tuple[str, int]] = []
        self.registrations: list[dict[str, Any]] = []
        self._fail: list[int] = []
        self._drop = 0
        self.max_wait_s = 0.5  # long polls are cut short so tests stay fast
        # as the real server: a valid update is answered 202 (received) and "checked later",
        # its outcome `checking` until a test calls decide()
        self.check_later = False
        self.earnings = {"today": "0.00", "total": "0.00"}
        handler = type("Handler", (_Handler,), {"market": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeMarketplace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, task: FakeTask) -> None:
        with self.lock:
            self.tasks[task.task["id"]] = task
            self.queue.append(task.task["id"])

    def fail_next(self, n: int, status: int = 503) -> None:
        with self.lock:
            self._fail += [status] * n

    def drop_next(self, n: int) -> None:
        with self.lock:
            self._drop += n

    def register_node(self) -> str:
        key = "gfx_n_" + secrets.token_hex(8)
        with self.lock:
            self.nodes[key] = f"node-{len(self.nodes) + 1}"
        return key

    def decide(self, task_id: str, status: str, reason: str = "") -> None:
        """The server's worker checked the received update: accepted or refused."""
        with self.lock:
            t = self.tasks[task_id]
            assert t.outcome is not None, "nothing was received for it"
            t.outcome = t.outcome | {"status": status, "reason": reason}

    def requeue(self, task_id: str) -> None:
        """The task goes back to the queue, as the real server releases a refused upload's
        task: the upload is dropped, what was decided about it kept (the server keeps it per
        node)."""
        with self.lock:
            self.tasks[task_id].accepted = None
            self.queue.append(task_id)

    def accepted(self) -> dict[str, bytes]:
        with self.lock:
            return {tid: t.accepted for tid, t in self.tasks.items() if t.accepted is not None}


class _Handler(BaseHTTPRequestHandler):
    market: FakeMarketplace
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    # --------------------------------------------------------------- plumbing

    def _reply(self, status: int, body: Any = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        with self.market.lock:  # before the reply: a client that has it may count at once
            self.market.requests.append((self.command, self.path, status))
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if raw else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, detail: str, **extra: Any) -> None:
        self._reply(status, {"error": code, "detail": detail, **extra})

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _node(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ").strip()
        return self.market.nodes.get(key)

    def _handle(self) -> None:
        m = self.market
        body = self._body()
        with m.lock:
            if m._drop:
                m._drop -= 1
                self.close_connection = True
                self.connection.shutdown(2)  # answer nothing: a dropped connection
                return
            fail = m._fail.pop(0) if m._fail else None
        if fail:
            self._error(fail, "unavailable", "injected failure")
            return
        url = urlparse(self.path)
        path = url.path.removeprefix("/api/v1/")
        if self.command == "POST" and path == "nodes/":
            if self.headers.get("Authorization") != f"Bearer {PROVIDER_KEY}":
                return self._error(401, "unauthorized", "provider key is wrong")
            key = m.register_node()
            with m.lock:
                m.registrations.append(json.loads(body))
            return self._reply(201, {"id": m.nodes[key], "node_key": key})
        node = self._node()
        if node is None:
            return self._error(401, "unauthorized", "node key is wrong or revoked")
        if path == "agent/heartbeat":
            beat = json.loads(body)
            if any(
                v is None for part in ("metrics", "network") for v in beat.get(part, {}).values()
            ):
                return self._error(400, "invalid", "metrics and network values are numbers")
            with m.lock:
                m.heartbeats.append(beat)
            return self._reply(200, {"server_time": time.time(), "heartbeat_interval_s": 0.5,
                                     "lease_timeout_s": 60})  # fmt: skip
        if path == "agent/claim":
            wait = min(float(parse_qs(url.query).get("wait", ["0"])[0]), m.max_wait_s)
            end = time.monotonic() + wait
            with m.lock:
                m.claims += 1
            while True:
                with m.lock:
                    if m.queue:
                        t = m.tasks[m.queue.pop(0)]
                        t.leased_to = node
                        return self._reply(200, {"task": t.task})
                if time.monotonic() >= end:
                    return self._reply(204)
                time.sleep(0.05)
        if path == "agent/probe":  # the link test: random bytes down, any body up
            if self.command == "GET":
                n = int(parse_qs(url.query).get("bytes", ["32768"])[0])
                return self._reply(200, raw=os.urandom(n))
            return self._reply(200, {"received": len(body)})
        if path == "agent/me":
            return self._reply(200, {"id": node, "name": node, "state": "idle",
                                     "reliability": 1.0, "earnings": m.earnings})  # fmt: skip
        parts = path.split("/")
        if len(parts) == 4 and parts[:2] == ["agent", "tasks"]:
            t = m.tasks.get(parts[2])
            if t is None or t.leased_to != node:
                return self._error(404, "not_found", "no such task for this node")
            what = parts[3]
            if self.command == "GET" and what == "model":
                with m.lock:
                    t.model_gets += 1
                    raw = t.model
                    if t.corrupt_models > 0:  # the last byte is tensor data: the hash breaks
                        t.corrupt_models -= 1
                        raw = raw[:-1] + bytes([raw[-1] ^ 0xFF])
                return self._reply(200, raw=raw)
            if self.command == "GET" and what == "shard":
                return self._reply(200, raw=t.shard)
            if self.command == "PUT" and what == "update":
                return self._update(t, body)
            if self.command == "GET" and what == "update":
                with m.lock:
                    outcome = t.outcome
                if outcome is None:
                    return self._error(404, "not_found", "this node has no upload for it")
                return self._reply(200, outcome)
            if self.command == "POST" and what == "fail":
                with m.lock:
                    t.failed.append(json.loads(body))
                return self._reply(200, {"ok": True})
        return self._error(404, "not_found", f"no endpoint {self.command} {path}")

    def _update(self, t: FakeTask, body: bytes) -> None:
        m = self.market
        json.loads(self.headers.get("X-GPUFlex-Metrics", "{}"))
        with m.lock:
            if t.accepted is not None:
                status = 200 if body == t.accepted else 409
                m.puts.append((t.task["id"], status))
                if status == 409:
                    return self._error(409, "conflict", "a different update was accepted")
                return self._reply(200, {"accepted": True})
        try:
            decode_update(body, t.reference, 1e4)
        except UpdateRejected as exc:
            with m.lock:
                m.puts.append((t.task["id"], 422))
            return self._error(422, "update_rejected", str(exc), reason=exc.reason)
        with m.lock:
            t.accepted = body
            if m.check_later:
                m.puts.append((t.task["id"], 202))
                digest = hashlib.sha256(body).hexdigest()
                t.outcome = {"status": "checking", "update_hash": digest, "reason": ""}
            else:
                m.puts.append((t.task["id"], 201))
        if m.check_later:
            return self._reply(202, {"accepted": True, "checked": False})
        self._reply(201, {"accepted": True})

    do_GET = do_POST = do_PUT = _handle
