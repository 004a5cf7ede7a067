"""A real Celery worker process (with beat) on Redis aggregates rounds and reclaims lost
leases for a job driven by HTTP clients acting as nodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from marketplace.jobs.models import Job
from marketplace.nodes.models import Node
from marketplace.rounds.aggregation import artifact_store, read_checkpoint
from marketplace.rounds.models import Task
from marketplace.server.celery import app
from marketplace.server.routing import worker_queues
from tests.marketplace.helpers import SMALL_SPEC
from trainer.provenance import ProvenanceChain, verify_with_artifacts
from trainer.spec import parse_spec

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
# generous bounds so a loaded machine does not fail the test; the loops end early on success
WAIT_S = 120


def _redis_up() -> bool:
    host, port = "127.0.0.1", 6379
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _reset_broker_connections() -> None:
    """Drop pooled connections so the next send uses the broker now configured."""
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[subprocess.Popen]:
    if not _redis_up():
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    queue = f"gpuflex-test-{uuid.uuid4().hex[:8]}"
    db = connection.settings_dict
    # the worker must use exactly this test database, whatever TEST_DATABASE_URL says
    env = {k: v for k, v in os.environ.items() if k != "TEST_DATABASE_URL"} | {
        "DJANGO_SETTINGS_MODULE": "marketplace.server.settings.test",
        "DATABASE_URL": (
            f"sqlite:///{db['NAME']}"
            if connection.vendor == "sqlite"
            else f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        ),
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "GPUFLEX_CELERY_QUEUE": queue,
        "GPUFLEX_DATA_DIR": str(settings.DATA_DIR),
        "GPUFLEX_TICK_S": "1",
        "OMP_NUM_THREADS": "1",
    }
    log = tmp_path / "worker.log"
    cmd = [
        sys.executable, "-m", "celery", "-A", "marketplace.server.celery", "worker",
        "--beat-thread", "--pool", "solo", "--loglevel", "INFO",
        "-Q", ",".join(worker_queues("all", queue)),
        "--schedule", str(tmp_path / "beat-schedule"),
    ]  # fmt: skip
    conf = app.conf
    # the embedded filesystem broker is a transport class; Redis is picked by the URL
    saved = (conf.task_always_eager, conf.broker_url, conf.broker_transport,
             conf.task_default_queue)  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:  # everything after Popen inside try: the worker must never outlive the test
        conf.task_always_eager, conf.broker_url, conf.task_default_queue = False, REDIS_URL, queue
        conf.broker_transport = None
        _reset_broker_connections()
        yield proc
    finally:
        (conf.task_always_eager, conf.broker_url, conf.broker_transport,
         conf.task_default_queue) = saved  # fmt: skip
        _reset_broker_connections()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.returncode not in (0, -signal.SIGTERM):
            sys.stderr.write(log.read_text(errors="replace")[-5000:])


def drive(agents, job_id: str) -> None:
    """Agents claim with long polls and work until the job ends."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if Job.objects.get(pk=job_id).status == "completed":
            return
        for agent in agents:
            agent.heartbeat("idle")
            task = agent.claim(wait=0.5)
            if task is not None:
                assert agent.work(task).status_code == 202
    raise AssertionError(f"job not completed within {WAIT_S} s")


@pytest.mark.integration
def test_worker_runs_the_rounds_and_the_tick(worker, make_agent, submit) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    lost = make_agent(kind="platform")
    job = submit(SMALL_SPEC | {"rounds": {"max_rounds": 2}}, tier="platform")

    # a node takes a task and vanishes; the worker's beat tick must hand it to another node
    # round 1 opens once the worker has built the job's model (jobs/preparation.py)
    stolen = lost.claim(wait=30)
    assert stolen is not None
    Node.objects.filter(pk=lost.node_id).update(
        last_heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    drive(agents, job["id"])

    db_job = Job.objects.get(pk=job["id"])
    assert db_job.rounds_done == 2 and worker.poll() is None
    reassigned = Task.objects.get(pk=stolen["id"])
    assert reassigned.node_id != lost.node_id and reassigned.status == "done"
    assert Node.objects.get(pk=lost.node_id).state == "offline"
    chain = ProvenanceChain.from_json(read_checkpoint(db_job).extra["provenance"])
    report = verify_with_artifacts(chain, artifact_store(), parse_spec(db_job.spec).aggregation)
    assert report.ok and len(chain) == 2, str(report)
