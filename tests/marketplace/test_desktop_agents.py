"""The real contributor agent (desktop/) against the real marketplace over HTTP.

Two headless agents, each running tasks in its own sandboxed process, train a digits job to
completion through the public REST API only; one job sends top-k updates with error
feedback, the agents keeping each job's residual between tasks.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from desktop.agent import Agent
from desktop.benchmark import BenchmarkResult
from desktop.client import Backoff
from desktop.config import Credentials, Paths, Settings
from desktop.hardware import detect
from marketplace.jobs.models import Job, Task
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Guards against hanging only; nothing here asserts how fast."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _agent(tmp: Path, name: str, url: str, key: str, kind: str, monkeypatch) -> Agent:
    monkeypatch.setenv("GPUFLEX_KEYRING", "file")
    for folder in ("CONFIG", "DATA", "CACHE"):
        monkeypatch.setenv(f"GPUFLEX_NODE_{folder}_DIR", str(tmp / name / folder.lower()))
    paths = Paths.default()
    Credentials(paths).set_provider_key(key)
    settings = Settings(server_url=url, node_name=name, kind=kind, task_wall_s=300,
                        task_memory_mb=4096, first_run_done=True)  # fmt: skip
    hw = detect()
    bench = BenchmarkResult(
        fingerprint=hw.fingerprint(), device="cpu", device_name=hw.cpu_name, quick=True,
        matmul_tflops={"fp32": 0.1}, memory_gbps=5.0, h2d_gbps=None, d2h_gbps=None,
        train_samples_per_s={"mlp": 20000.0},
    )  # fmt: skip
    backoff = Backoff(base_s=0.1, cap_s=1.0, attempts=8)
    return Agent(settings, paths, bench=bench, backoff=backoff, claim_wait_s=1,
                 idle_sleep_s=0.2)  # type: ignore[arg-type]  # fmt: skip


# Volunteers on a hybrid job: every task of a new node is replicated and verified.
# Platform nodes on a platform job: no replicas, so top-k with error feedback is used as is.
@pytest.mark.parametrize(
    ("codec", "kind", "tier", "used"),
    [
        ("none", "volunteer", "hybrid", {"none"}),
        ("topk", "volunteer", "hybrid", {"int8", "topk"}),
        ("topk", "platform", "platform", {"topk"}),
    ],
)
def test_agents_train_a_job_to_completion(
    live_server, make_user, submit, tmp_path, monkeypatch, codec, kind, tier, used
) -> None:
    _, provider_key = make_user("provider")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["compression"] = {"codec": codec, "topk_fraction": 0.2}
    job = submit(spec=spec, tier=tier)
    agents = [
        _agent(tmp_path, f"agent-{i}", live_server.url, provider_key, kind, monkeypatch)
        for i in range(2)
    ]
    for agent in agents:
        agent.start()
    try:
        _wait(lambda: Job.objects.get(pk=job["id"]).status == "completed", 240, "the job")
    finally:
        for agent in agents:
            agent.stop()
    stored = Job.objects.get(pk=job["id"])
    assert stored.rounds_done == 2 and stored.model_hash
    tasks = Task.objects.filter(round__job=stored)
    assert tasks.filter(status="done").count() >= 6
    rows = list(tasks.values_list("round_id", "shard_id", "codec"))
    assert {c for _, _, c in rows} <= used
    # A replicated unit must verify, so top-k (node-dependent through its residual) travels
    # as int8 there; new volunteers are always replicated, trusted ones only sometimes.
    units: dict[tuple[int, int], list[str]] = {}
    for round_id, shard_id, task_codec in rows:
        units.setdefault((round_id, shard_id), []).append(task_codec)
    for unit, codecs in units.items():
        if len(codecs) > 1 and codec != "none":
            assert set(codecs) == {"int8"}, unit
    assert any(len(c) > 1 for c in units.values()) == (kind == "volunteer")
    assert sum(agent.status().completed for agent in agents) >= 6
    if used == {"topk"}:  # each agent kept the job's error-feedback residual between tasks
        assert all(any((tmp_path / f"agent-{i}").rglob("feedback/*.safetensors")) for i in (0, 1))
