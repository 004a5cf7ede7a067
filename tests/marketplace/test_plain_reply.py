"""The claim's reply is written as plain dicts (`claim_reply`, api/serializers/plain.py), not
through DRF's per-field machinery (issue 36): it must be byte for byte the JSON that
ClaimReplySerializer writes for the same claim, key order included, with every optional
field present or absent."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from rest_framework.renderers import JSONRenderer

from marketplace.api.serializers.agent import ClaimReplySerializer, claim_reply
from marketplace.nodes.models import Node
from marketplace.rounds.scheduling import claim_batch, task_payloads
from tests.marketplace.helpers import SMALL_SPEC


def _json(data: Any) -> bytes:
    return JSONRenderer().render(data)


def _same(payloads: list[dict[str, Any]]) -> bytes:
    reply = {"task": payloads[0], "tasks": payloads}
    old = _json(ClaimReplySerializer(copy.deepcopy(reply)).data)
    new = _json(claim_reply(reply))
    assert new == old
    return new


@pytest.mark.django_db(transaction=True)
def test_a_real_claims_reply_is_the_serializers_json(make_agent, submit) -> None:
    agent = make_agent()
    submit(SMALL_SPEC | {"sharding": {"method": "random", "num_shards": 20}})
    node = Node.objects.get(pk=agent.node_id)
    for count in (3, 1, 8):
        tasks = claim_batch(node, count)
        payloads = task_payloads(tasks)
        assert _same(payloads)
        assert [
            t["id"] for t in claim_reply({"task": payloads[0], "tasks": payloads})["tasks"]
        ] == [str(t.pk) for t in tasks]


BASE: dict[str, Any] = {
    "id": "0b8e5a4c-2f61-4c1e-9c55-7d3c2f1f0a11",
    "job_id": "5d2b9a10-6d3e-4a5e-8a49-1e2f3a4b5c6d",
    "round": 3,
    "kind": "train",
    "spec": {"name": "x", "local": {"steps": 10}, 7: "int key"},
    "steps": 12,
    "batch_size": 32,
    "seed": 99,
    "codec": "int8",
    "proximal_mu": 0,
    "lr": 0.01,
    "deadline": datetime(2026, 11, 28, 22, 0, 1, 123456, tzinfo=UTC),
    "model_hash": "a" * 64,
    "model_source": {"kind": "full"},
    "shard_hash": "b" * 64,
    "overlap": False,
    "footprint": {"parameters": 10, "trainable": 10.0},
}


def test_every_optional_field_is_written_as_the_serializer_writes_it() -> None:
    variants = [
        BASE,
        BASE | {"deadline": datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))},
        BASE | {"steps": None, "batch_size": None, "shard_hash": None, "footprint": None},
        BASE | {"model_source": {"kind": "delta", "base": "c" * 64, "chain": ["d", "e"]}},
        BASE | {"model_source": {"kind": "seed", "input_shape": [1, 28, 28], "num_classes": 10}},
        BASE | {"local_dataset": "clinic-a", "program": True, "overlap": True},
        BASE
        | {
            "zone": {
                "name": "eu",
                "aggregator": 4,
                "url": "http://a/zone",
                "round_id": 7,
                "samples": 640,
                "token": "tok",
            }
        },
        {k: v for k, v in BASE.items() if k not in ("overlap", "footprint", "shard_hash")},
    ]
    for payload in variants:
        _same([payload])
    _same(variants)


def test_a_missing_required_field_is_an_error_as_it_was() -> None:
    broken = {k: v for k, v in BASE.items() if k != "model_hash"}
    with pytest.raises(KeyError):
        ClaimReplySerializer({"task": broken, "tasks": [broken]}).data  # noqa: B018
    with pytest.raises(KeyError):
        claim_reply({"task": broken, "tasks": [broken]})


def test_threads_write_the_same_reply() -> None:
    want = _same([BASE])

    def write(_: int) -> bytes:
        return _json(claim_reply({"task": BASE, "tasks": [BASE]}))

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(write, range(64))) == {want}
