"""The heartbeat's serializer keeps one set of fields per thread (issue 36: deep-copying
them was most of its validation cost) and still checks every body as DRF's own copy does;
the claim's reply serializers too, writing what DRF's own copy writes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from rest_framework import serializers

from marketplace.api.serializers.agent import (
    ClaimReplySerializer,
    HeartbeatSerializer,
    ModelSourceSerializer,
    TaskSerializer,
)
from marketplace.nodes.models import Node
from marketplace.rounds.scheduling import claim_batch, task_payloads
from tests.marketplace.helpers import SMALL_SPEC

BODIES: list[Any] = [
    {"state": "idle"},
    {"state": "working", "metrics": {"gpu_util": "busy"}},
    {"state": "working", "metrics": {"gpu_temp_c": 1e6}, "progress": "half"},
    {"state": "idle", "network": {"up_mbps": -5, "loss": "abc"}},
    {"state": "sleeping", "task_ids": ["x" * 65]},
    {"state": "working", "task_id": "t1", "task_ids": ["t1", "t2"], "progress": 0.5,
     "metrics": {"gpu_util": 50, "gpu_mem_used_mb": 100}, "network": {"rtt_ms": 3}},
    {"state": "paused", "reason": "a game", "metrics": []},
    [],
]  # fmt: skip


class Copied(HeartbeatSerializer):
    """The same serializer with DRF's own fields: deep-copied for each instance."""

    fields = serializers.Serializer.fields


def _outcome(cls: type, body: Any) -> tuple[bool, Any]:
    checked = cls(data=body)
    ok = checked.is_valid()
    return ok, checked.validated_data if ok else checked.errors


def test_every_body_is_checked_as_drfs_own_fields_check_it() -> None:
    for _ in range(3):  # the second and later instances reuse the first one's fields
        for body in BODIES:
            assert _outcome(HeartbeatSerializer, body) == _outcome(Copied, body), body
    first, second = HeartbeatSerializer(data={}), HeartbeatSerializer(data={})
    assert first.fields["state"] is second.fields["state"]
    assert second.fields["metrics"].parent is second  # bound to the instance in use


def test_threads_keep_fields_of_their_own() -> None:
    def run(n: int) -> list[tuple[bool, Any]]:
        return [_outcome(HeartbeatSerializer, BODIES[(n + i) % len(BODIES)]) for i in range(40)]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(16)))
    for n, got in enumerate(results):
        want = [_outcome(Copied, BODIES[(n + i) % len(BODIES)]) for i in range(40)]
        assert got == want


class CopiedSource(ModelSourceSerializer):
    fields = serializers.Serializer.fields


class CopiedTask(TaskSerializer):
    fields = serializers.Serializer.fields
    model_source = CopiedSource()


class CopiedClaim(ClaimReplySerializer):
    fields = serializers.Serializer.fields
    task = CopiedTask()
    tasks = CopiedTask(many=True)


@pytest.mark.django_db(transaction=True)
def test_a_claims_reply_is_what_drfs_own_fields_write(make_agent, submit) -> None:
    """The claim's reply (ClaimReplySerializer, its tasks and their model sources) keeps its
    fields per thread too: the same JSON as DRF's deep-copied fields, claim after claim."""
    agent = make_agent()
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 20}})
    node = Node.objects.get(pk=agent.node_id)
    for count in (3, 1, 4):
        tasks = claim_batch(node, count)
        payloads = task_payloads(tasks)
        reply = {"task": payloads[0], "tasks": payloads}
        got = ClaimReplySerializer(reply).data
        assert got == CopiedClaim(reply).data
        assert [t["id"] for t in got["tasks"]] == [str(t.pk) for t in tasks]
