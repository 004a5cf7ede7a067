"""Shared test data and helpers (importable from test modules, unlike conftest)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

SMALL_SPEC: dict[str, Any] = {
    "name": "digits-small",
    "seed": 0,
    "dataset": {"kind": "digits", "test_fraction": 0.2},
    "model": {"arch": "mlp", "hidden": [32]},
    "optimizer": {"name": "sgd", "lr": 0.2},
    "local": {"steps": 8, "batch_size": 32},
    "rounds": {"max_rounds": 2},
    "sharding": {"method": "stratified", "num_shards": 3},
}

HARDWARE = {"gpu_vendor": "nvidia", "gpu_model": "RTX 4090", "memory_gb": 24, "driver": "550"}


def client_for(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def assert_claim_and_planner_agree(nodes: dict[str, Any], job: dict, allowed: set[str]) -> None:
    """The live claim and the bulk planner (`lease_batch`) lease the job's tasks to exactly
    the `allowed` of `nodes` (test agents by name): one eligibility rule, two paths."""
    from marketplace.nodes.models import Node
    from marketplace.rounds.models import Task, TaskStatus
    from marketplace.rounds.scheduling import lease_batch

    claimed = {name for name, agent in nodes.items() if agent.claim() is not None}
    assert claimed == allowed  # the live claim
    Task.objects.filter(round__job=job["id"]).update(status=TaskStatus.PENDING, node=None)
    rows = Node.objects.filter(pk__in=[a.node_id for a in nodes.values()])
    assert lease_batch(list(rows)) == len(allowed)  # the bulk planner, by the same rule
    leased = set(Task.objects.filter(status=TaskStatus.LEASED).values_list("node_id", flat=True))
    assert leased == {nodes[name].node_id for name in allowed}


class LeanPaths:
    """Counts a lean answerer's answers (api/heartbeat_fast.py, api/claim_fast.py);
    `drf_only()` turns it off, so the DRF view answers everything."""

    def __init__(self, module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lean = 0
        self._module, self._monkeypatch = module, monkeypatch
        answer = module.answer

        def counting(request: Any) -> Any:
            response = answer(request)
            self.lean += response is not None
            return response

        monkeypatch.setattr(module, "answer", counting)

    def drf_only(self) -> None:
        self._monkeypatch.setattr(self._module, "answer", lambda request: None)


def counted(r: Any, throttle: Any, key: Any) -> int:
    """An API key's requests in `throttle`'s current and previous windows, as Redis holds
    them (rate_counts' keys)."""
    from marketplace.api.rate_counts import redis_key

    current, previous, _ = throttle._windows(f"{throttle.key_base()}{key.pk}")
    return sum(int(c or 0) for c in r.mget(redis_key(current), redis_key(previous)))


def redis_commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the Redis commands this process sends from now on, as they go on the
    wire: through redis-py's client and through marketplace/server/redis_lane.py's own
    connections alike."""
    from redis.connection import AbstractConnection

    seen: list[str] = []
    send = AbstractConnection.send_packed_command

    def spy(self: Any, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, bytes | str) else command
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        seen.append(data.split(b"\r\n")[2].decode().upper())  # *N, $len, the name
        return send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", spy)
    return seen
