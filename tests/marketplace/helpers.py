"""Shared test data and helpers (importable from test modules, unlike conftest)."""

from __future__ import annotations

from typing import Any

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
