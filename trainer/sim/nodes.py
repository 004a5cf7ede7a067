"""One simulated node's side of network-aware training: its weights, its copy of the global
model, its codec state, the update it has in flight, and what the coordinator measured of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainer.adapt import NodeMeasurement
from trainer.compression import ErrorFeedback
from trainer.datasets import Dataset
from trainer.sim.network import NodeProfile

State = dict[str, torch.Tensor]


@dataclass
class InFlight:
    """An update a node sent; it arrives at `arrival` (None: the node dropped out first)."""

    version: int  # the global model version it is a delta against
    sent: float
    arrival: float | None
    payload: bytes
    num_samples: int
    loss: float
    two_rounds: bool  # a far node's planned two-round job


@dataclass
class SimNode:
    index: int
    profile: NodeProfile
    shard: Dataset
    shard_hash: str
    local: State | None = None  # the node's weights as of its last send
    copy: State | None = None  # the global model as this node holds it
    version: int = 0  # which global version `copy` is
    last_send: float = 0.0
    merge_at: float = 0.0  # when `copy` arrived
    feedback: ErrorFeedback = field(default_factory=ErrorFeedback)
    job: InFlight | None = None
    # (start, end) of the node's time spent computing, and spent only transferring (or paying
    # a task's fixed cost before its download)
    computing: list[tuple[float, float]] = field(default_factory=list)
    computing_since: float | None = None  # an overlapped node trains on after its send
    transferring: list[tuple[float, float]] = field(default_factory=list)
    transfers: int = 0
    failed: int = 0
    updates: int = 0
    rejected: int = 0
    agreement: float | None = None

    @property
    def node_id(self) -> str:
        return f"node-{self.index}"

    def measurement(self, step_s: float) -> NodeMeasurement:
        """The benchmark and network probe, plus the coordinator's record of past rounds."""
        p = self.profile
        return NodeMeasurement(
            node_id=self.node_id,
            step_s=step_s,
            rtt_s=p.rtt_s,
            up_bps=p.up_bps,
            down_bps=p.down_bps,
            loss=p.loss,
            transfers=self.transfers,
            failed_transfers=self.failed,
            agreement=self.agreement,
            validation_failures=self.rejected,
            updates=self.updates,
            uptime=1 - self.failed / self.transfers if self.transfers else 1.0,
        )


def time_in(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def computing_in(node: SimNode, start: float, end: float) -> float:
    open_span = [] if node.computing_since is None else [(node.computing_since, end)]
    return time_in(node.computing + open_span, start, end)
