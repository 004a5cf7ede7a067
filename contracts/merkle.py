"""Merkle trees exactly as OpenZeppelin's StandardMerkleTree builds them.

Leaves are double-hashed ABI encodings (so a 64-byte inner node can never pass for a leaf),
sorted by hash, laid out as a complete binary tree in one array, and pairs are hashed in sorted
order, which is what ``MerkleProof.verify`` in the contract expects. Keeping the layout
identical to the JavaScript library means roots and proofs can be cross-checked with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from eth_abi import encode
from eth_utils import keccak, to_canonical_address


def leaf_hash(provider: str, token: str, amount: int) -> bytes:
    """``keccak256(bytes.concat(keccak256(abi.encode(provider, token, amount))))``."""
    if amount < 0 or amount >= 2**256:
        raise ValueError(f"amount out of uint256 range: {amount}")
    inner = keccak(
        encode(
            ["address", "address", "uint256"],
            [to_canonical_address(provider), to_canonical_address(token), amount],
        )
    )
    return keccak(inner)


def contribution_leaf_hash(node: bytes, contributions: int, samples: int, earnings: int) -> bytes:
    """``ProvenanceRegistry.contributionLeaf``: the same double hash over
    ``abi.encode(bytes32 node, uint256 contributions, uint256 samples, uint256 earnings)``."""
    for value in (contributions, samples, earnings):
        if value < 0 or value >= 2**256:
            raise ValueError(f"value out of uint256 range: {value}")
    if len(node) != 32:
        raise ValueError("a node id is 32 bytes")
    inner = keccak(
        encode(
            ["bytes32", "uint256", "uint256", "uint256"], [node, contributions, samples, earnings]
        )
    )
    return keccak(inner)


def hash_pair(a: bytes, b: bytes) -> bytes:
    return keccak(a + b) if a < b else keccak(b + a)


class MerkleTree:
    """A tree over already-hashed leaves; ``proof`` and ``root`` match OpenZeppelin's."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        if len(set(leaves)) != len(leaves):
            # Equal leaves would share one "claimed" flag on-chain: only one could be paid.
            raise ValueError("duplicate leaves")
        self.leaves: list[bytes] = sorted(leaves)
        n = len(self.leaves)
        tree: list[bytes] = [b""] * (2 * n - 1)
        for i, leaf in enumerate(self.leaves):
            tree[len(tree) - 1 - i] = leaf
        for i in range(len(tree) - 1 - n, -1, -1):
            tree[i] = hash_pair(tree[2 * i + 1], tree[2 * i + 2])
        self._tree = tree
        self._position = {leaf: len(tree) - 1 - i for i, leaf in enumerate(self.leaves)}

    @property
    def root(self) -> bytes:
        return self._tree[0]

    def proof(self, leaf: bytes) -> list[bytes]:
        try:
            i = self._position[leaf]
        except KeyError:
            raise KeyError("leaf is not in this tree") from None
        proof: list[bytes] = []
        while i > 0:
            sibling = i + 1 if i % 2 == 1 else i - 1
            proof.append(self._tree[sibling])
            i = (i - 1) // 2
        return proof


def verify(proof: Sequence[bytes], root: bytes, leaf: bytes) -> bool:
    """The same check as ``MerkleProof.verify``, for serving proofs that are known good."""
    node = leaf
    for sibling in proof:
        node = hash_pair(node, sibling)
    return node == root
