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
