"""Contribution trees: what one settlement batch credited each node with, as a Merkle tree.

One leaf per node: ``(node id as bytes32, verified contributions, samples, earnings in token
base units)`` in OpenZeppelin's StandardMerkleTree encoding, exactly what
``ProvenanceRegistry.verifyContribution`` checks. The root is anchored once per batch, so a
provider holding its leaf and proof can check against the chain what the batch credited it
with. Like ``SettlementBatch``, a tree round-trips through JSON so the ledger can store it and
serve proofs long after the batch closed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from contracts import merkle
from contracts.ids import Bytes32Like, to_bytes32


@dataclass(frozen=True)
class NodeContribution:
    node_id: Bytes32Like
    contributions: int  # verified (charged) task results
    samples: int  # training samples those results covered
    earnings: int  # what they paid the node's owner, in token base units

    def key(self) -> bytes:
        return to_bytes32(self.node_id)

    def leaf(self) -> bytes:
        return merkle.contribution_leaf_hash(
            self.key(), self.contributions, self.samples, self.earnings
        )


@dataclass(frozen=True)
class ContributionProof:
    """What a provider needs to check its leaf on chain (``verifyContribution``)."""

    batch_id: bytes
    node: bytes
    contributions: int
    samples: int
    earnings: int
    root: bytes
    proof: tuple[bytes, ...]

    def verify(self) -> bool:
        """The check ``verifyContribution`` makes, against this proof's own root (compare
        the root with the anchored one: ``ChainClient.contributions_of``)."""
        leaf = merkle.contribution_leaf_hash(
            self.node, self.contributions, self.samples, self.earnings
        )
        return merkle.verify(self.proof, self.root, leaf)

    def call_args(self) -> tuple[Any, ...]:
        """The arguments of ``verifyContribution``, in order."""
        return (self.batch_id, self.node, self.contributions, self.samples, self.earnings,
                list(self.proof))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": "0x" + self.batch_id.hex(),
            "node": "0x" + self.node.hex(),
            "contributions": self.contributions,
            "samples": self.samples,
            "earnings": str(self.earnings),
            "root": "0x" + self.root.hex(),
            "proof": ["0x" + p.hex() for p in self.proof],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContributionProof:
        return cls(
            batch_id=to_bytes32(data["batch_id"]),
            node=to_bytes32(data["node"]),
            contributions=int(data["contributions"]),
            samples=int(data["samples"]),
            earnings=int(data["earnings"]),
            root=to_bytes32(data["root"]),
            proof=tuple(to_bytes32(p) for p in data["proof"]),
        )


@dataclass(frozen=True)
class ContributionTree:
    batch_id: bytes
    nodes: tuple[NodeContribution, ...]  # one per node, sorted by node id
    tree: merkle.MerkleTree = field(repr=False, compare=False)

    @classmethod
    def build(cls, batch_id: Bytes32Like, nodes: Iterable[NodeContribution]) -> ContributionTree:
        merged: dict[bytes, list[int]] = {}
        for n in nodes:
            if min(n.contributions, n.samples, n.earnings) < 0:
                raise ValueError(f"contribution figures must not be negative: {n}")
            totals = merged.setdefault(n.key(), [0, 0, 0])
            totals[0] += n.contributions
            totals[1] += n.samples
            totals[2] += n.earnings
        if not merged:
            raise ValueError("a contribution tree needs at least one node")
        rows = tuple(NodeContribution(k, *v) for k, v in sorted(merged.items()))
        return cls(to_bytes32(batch_id), rows, merkle.MerkleTree([r.leaf() for r in rows]))

    @property
    def root(self) -> bytes:
        return self.tree.root

    def proof_for(self, node_id: Bytes32Like) -> ContributionProof:
        key = to_bytes32(node_id)
        for row in self.nodes:
            if row.key() == key:
                return ContributionProof(
                    self.batch_id, key, row.contributions, row.samples, row.earnings,
                    self.root, tuple(self.tree.proof(row.leaf())),
                )  # fmt: skip
        raise KeyError(f"node 0x{key.hex()} has no contribution in this batch")

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch_id": "0x" + self.batch_id.hex(),
                "root": "0x" + self.root.hex(),
                "nodes": [
                    ["0x" + r.key().hex(), r.contributions, r.samples, str(r.earnings)]
                    for r in self.nodes
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> ContributionTree:
        data = json.loads(text)
        tree = cls.build(
            data["batch_id"],
            [NodeContribution(n, int(c), int(s), int(e)) for n, c, s, e in data["nodes"]],
        )
        if "0x" + tree.root.hex() != data["root"]:
            raise ValueError("stored root does not match the stored contributions")
        return tree
