"""Claim order: oldest round first, then within a round the shards the node already holds
(its input cache serves them), then shard order; read off the index, not by sorting every
pending task (scheduling._candidates)."""

from __future__ import annotations

import pytest

from marketplace.nodes.models import Node
from marketplace.rounds.models import ShardCopy, Task
from marketplace.rounds.scheduling import claim_batch
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db


def test_held_shards_come_first_within_a_round(make_agent, submit) -> None:
    holder, other = (Node.objects.get(pk=make_agent().node_id) for _ in range(2))
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 6}})
    tasks = list(Task.objects.filter(replica=0).order_by("shard__index"))
    held = [tasks[4].shard, tasks[2].shard]
    ShardCopy.objects.bulk_create(ShardCopy(node=holder, shard=s) for s in held)
    got = claim_batch(holder, 3)
    # the two held shards in shard order, then the first shard nobody holds
    assert [t.shard_id for t in got] == [tasks[2].shard_id, tasks[4].shard_id, tasks[0].shard_id]
    # a node holding nothing takes shard order, skipping what is leased
    assert [t.shard_id for t in claim_batch(other, 2)] == [tasks[1].shard_id, tasks[3].shard_id]
