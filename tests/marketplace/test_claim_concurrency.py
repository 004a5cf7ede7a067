"""Concurrent claims never lease one task twice (threads hammering PostgreSQL)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection

from marketplace.nodes.models import Node
from marketplace.rounds.models import Task
from marketplace.rounds.scheduling import claim_batch
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8


def hammer(
    node_ids: list[int], claimed: list[tuple[int, str]], errors: list[BaseException], batch: int
) -> None:
    barrier = threading.Barrier(len(node_ids))

    def run(node_id: int) -> None:
        try:
            node = Node.objects.get(pk=node_id)
            barrier.wait()
            while tasks := claim_batch(node, batch):
                claimed.extend((node_id, str(task.pk)) for task in tasks)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in node_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize(("kind", "batch"), [("platform", 1), ("volunteer", 1), ("volunteer", 5)])
def test_no_task_is_leased_twice(make_agent, submit, kind: str, batch: int) -> None:
    agents = [make_agent(kind=kind) for _ in range(THREADS)]
    spec = SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 60}}
    submit(spec, tier=kind if kind == "platform" else "volunteer")
    claimed: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    hammer([a.node_id for a in agents], claimed, errors, batch)
    assert not errors, errors
    counts = Counter(task_id for _, task_id in claimed)
    assert counts and max(counts.values()) == 1, "a task was leased twice"
    leased = Task.objects.filter(status="leased")
    assert leased.count() == len(claimed)
    assert {str(t.pk): t.node_id for t in leased} == dict((t, n) for n, t in claimed)
    # replicas of one unit always sit on different nodes
    units = Counter((t.round_id, t.shard_id, t.node_id) for t in leased)
    assert max(units.values()) == 1
    if kind == "volunteer":  # new volunteers are untrusted: replicas were made and taken
        assert Task.objects.filter(replica__gt=0, status="leased").exists()
