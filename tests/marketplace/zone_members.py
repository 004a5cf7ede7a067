"""A zones job's round with its members' updates handed to their aggregator, and the partial
sum the aggregator would send for them (trainer.zones): what the tests of receiving and
checking partials start from (test_received_partials.py, test_web_partial_torch_free.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.marketplace.agents import Agent
from tests.marketplace.helpers import SMALL_SPEC

ZONE_SPEC = SMALL_SPEC | {
    "sharding": {"method": "stratified", "num_shards": 2},
    "aggregation": {"hierarchy": "zones"},
}


@dataclass
class Handed:
    """A member's task, its trained update and metrics, handed to the zone's aggregator."""

    agent: Agent
    task: dict[str, Any]
    payload: bytes
    metrics: dict[str, float]


@dataclass
class ZoneRound:
    aggregator: Agent
    job: dict[str, Any]
    members: list[Handed]

    @property
    def round_id(self) -> int:
        return int(self.members[0].task["zone"]["round_id"])

    def partial(self, scale: float = 1.0) -> bytes:
        """The members' partial sum as the aggregator encodes it (`scale` != 1 changes the
        sum, not the manifest: a sum its worker's check must refuse, e.g. NaN)."""
        from trainer.updates import decode_state
        from trainer.zones import Member, PartialSum, encode_partial

        partial = PartialSum()
        for m in self.members:
            delta = {k: v * scale for k, v in decode_state(m.payload)[0].items()}
            member = Member(
                m.task["id"], str(m.agent.node_id), hashlib.sha256(m.payload).hexdigest(),
                m.task["zone"]["samples"], m.metrics,
            )  # fmt: skip
            partial.add(delta, member)
        return encode_partial(partial, job_id=self.job["id"], round_id=str(self.round_id),
                              zone="eu")  # fmt: skip


def zone_round(
    make_agent: Callable[..., Agent], submit: Callable[..., dict[str, Any]]
) -> ZoneRound:
    """An aggregator in zone eu and two members there, each holding a task of round 1 whose
    update it trained and handed to the aggregator."""
    aggregator = make_agent(kind="platform", zone="eu", zone_url="http://agg-eu.test:8470")
    agents = [make_agent(kind="platform", zone="eu") for _ in range(2)]
    job = submit(ZONE_SPEC, tier="platform")
    claimed = [(agent, agent.claim()) for agent in agents]  # both leased before either works
    members = []
    for agent, task in claimed:
        assert task is not None and task["zone"]["aggregator"] == aggregator.node_id
        payload, metrics = agent.train(task)
        body = {"aggregator_id": aggregator.node_id,
                "update_hash": hashlib.sha256(payload).hexdigest()}  # fmt: skip
        handed = agent.client.post(f"/api/v1/agent/tasks/{task['id']}/handoff", body,
                                   format="json")  # fmt: skip
        assert handed.status_code == 200, handed.content
        members.append(Handed(agent, task, payload, metrics))
    return ZoneRound(aggregator, job, members)


def put_partial(aggregator: Agent, data: bytes) -> Any:
    return aggregator.client.put(
        "/api/v1/agent/zone/partial", data=data, content_type="application/octet-stream"
    )
