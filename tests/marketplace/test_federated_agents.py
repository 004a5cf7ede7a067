"""Federated mode on real agents: two contributor agents, each holding a different local silo
declared as its owner would (`gpuflex-node datasets add`), train a federated job through the
real marketplace over HTTP, and no byte of their rows ever leaves them."""

from __future__ import annotations

import csv
import math
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from desktop.agent import Agent
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.models import TaskResult
from tests.live_agents import live_agent
from tests.marketplace.test_federated import FEDERATED_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingTransport(httpx.HTTPTransport):
    """Every request the agent's HTTP client sends: its path and its whole body."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        with self._lock:
            self.sent.append((request.url.path, body))
        return super().handle_request(request)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Guards against hanging only; nothing here asserts how fast."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def write_silos(folder: Path, count: int) -> list[np.ndarray]:
    """`count` CSV silos of the digits, every value made distinctive (x 1.0371, so a value
    like 7.2597 is found nowhere but in these rows); each holds every class."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(7).permutation(len(digits.target))
    silos = []
    for i, part in enumerate(np.array_split(order, count)):
        x = np.round(digits.data[part] * 1.0371, 4)
        with (folder / f"silo{i}.csv").open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow([f"px{j}" for j in range(64)] + ["label"])
            labels = digits.target[part]
            out.writerows([*map(float, r), int(y)] for r, y in zip(x, labels, strict=True))
        silos.append(x)
    return silos


def _leaks(body: bytes, rows: np.ndarray) -> bool:
    """The body holds a row: 16 values of it as the CSV's text, or the whole row as the
    float32 tensor a shard would carry (only rows with many non-zero values: a run of zeros
    proves nothing)."""
    for row in rows[:50]:
        if np.count_nonzero(row) < 16:
            continue
        text = ",".join(str(float(v)) for v in row[16:32]).encode()
        packed = struct.pack(f"<{len(row)}f", *row.astype(np.float32))
        if text in body or packed in body:
            return True
    return False


def test_two_silos_train_a_federated_job_without_their_rows_leaving(
    live_server, make_user, submit, tmp_path, monkeypatch
) -> None:
    _, provider_key = make_user("provider")
    rows = write_silos(tmp_path, 2)
    transports = [RecordingTransport() for _ in rows]
    agents: list[Agent] = [
        live_agent(
            tmp_path,
            f"silo-{i}",
            live_server.url,
            provider_key,
            monkeypatch,
            kind="volunteer",
            transport=transports[i],
        )
        for i in range(2)
    ]
    for i, agent in enumerate(agents):
        found = agent.add_dataset("clinic", str(tmp_path / f"silo{i}.csv"))
        assert (found.rows, found.input_shape, found.num_classes) == (len(rows[i]), [64], 10)
    for agent in agents:
        agent.start()
    try:
        _wait(lambda: Node.objects.filter(local_datasets=["clinic"]).count() == 2, 120,
              "both silos to advertise their dataset")  # fmt: skip
        for node in Node.objects.all():  # advertised: the schema, rows and hash; no row
            schema = node.local_dataset_schemas["clinic"]
            assert schema["input_shape"] == [64] and schema["num_classes"] == 10
            assert len(schema["content_hash"]) == 64 and schema["kind"] == "csv"
            assert node.local_dataset_rows["clinic"] in {len(r) for r in rows}
        job = submit(spec=FEDERATED_SPEC, tier="volunteer", federated_dataset="clinic")
        _wait(lambda: Job.objects.get(pk=job["id"]).status == "completed", 240, "the job")
    finally:
        for agent in agents:
            agent.stop()
    done = Job.objects.get(pk=job["id"])
    assert done.rounds_done == 2
    results = TaskResult.objects.filter(task__round__job=done)
    assert results.count() == 4 and all(r.credited and r.verified is None for r in results)
    held = {n.pk: n.local_dataset_rows["clinic"] for n in Node.objects.all()}
    for r in results:  # each silo's update weighs its own train split (the spec's 80 %)
        assert r.num_samples == held[r.node_id] - math.ceil(0.2 * held[r.node_id])
    logs = [e.message for a in agents for e in a.logs(500)]
    assert sum("trains on local dataset 'clinic'" in m for m in logs) == 4
    for transport in transports:
        paths = [path for path, _ in transport.sent]
        assert any(p.endswith("/update") for p in paths)  # what was sent was recorded
        assert not any(p.endswith("/shard") for p in paths)  # no shard asked for
        for silo_rows in rows:  # neither its own rows nor (a fortiori) the other's
            assert not any(_leaks(body, silo_rows) for _, body in transport.sent)
    # the check can fail: a body carrying a row is caught
    row = next(r for r in rows[0][:50] if np.count_nonzero(r) >= 16)
    assert _leaks(b"x" + ",".join(str(float(v)) for v in row).encode(), rows[0])
