from __future__ import annotations

import shutil
import socket
import uuid
from pathlib import Path

import pytest

from tests.system.harness import System


@pytest.fixture(scope="session")
def measured(tmp_path_factory) -> Path:
    """This machine's hardware and benchmark, measured once (a child process, as the demo
    does) for every cluster of the session."""
    from desktop.probe import probe, save_measured

    cache = tmp_path_factory.mktemp("benchmark-cache")
    hw, result, _ = probe(cache, quick=True)
    assert result is not None
    save_measured(cache / "measured.json", hw, result)
    return cache / "measured.json"


@pytest.fixture
def system(tmp_path, measured):
    made: list[System] = []

    def make(**kwargs) -> System:
        s = System(tmp_path / "cluster", measured=measured, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
    shutil.rmtree(tmp_path / "cluster", ignore_errors=True)


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def services():
    if not (_up(5432) and _up(6379)):
        pytest.skip("needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379")
    import psycopg
    import redis

    name = f"gpuflex_demo_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    broker = "redis://127.0.0.1:6379/7"
    redis.Redis.from_url(broker).flushdb()
    yield {"DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{name}",
           "CELERY_BROKER_URL": broker, "REDIS_URL": "redis://127.0.0.1:6379/8"}  # fmt: skip
    redis.Redis.from_url(broker).flushdb()
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
