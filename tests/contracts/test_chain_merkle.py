from __future__ import annotations

import pytest
from eth_utils import keccak

from contracts import merkle
from contracts.records import NATIVE
from tests.contracts.chain_env import Env


def _leaves(n: int) -> list[bytes]:
    return [keccak(i.to_bytes(32, "big")) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 33])
def test_every_proof_verifies_and_no_other_leaf_does(n: int) -> None:
    leaves = _leaves(n)
    tree = merkle.MerkleTree(leaves)
    for leaf in leaves:
        proof = tree.proof(leaf)
        assert merkle.verify(proof, tree.root, leaf)
        assert not merkle.verify(proof, tree.root, keccak(b"not a leaf"))
    assert len(tree.proof(leaves[0])) <= n.bit_length()


def test_single_leaf_tree_is_the_leaf() -> None:
    (leaf,) = _leaves(1)
    tree = merkle.MerkleTree([leaf])
    assert tree.root == leaf and tree.proof(leaf) == []


def test_root_does_not_depend_on_leaf_order() -> None:
    leaves = _leaves(6)
    assert merkle.MerkleTree(leaves).root == merkle.MerkleTree(leaves[::-1]).root


def test_empty_and_duplicate_leaves_rejected() -> None:
    with pytest.raises(ValueError):
        merkle.MerkleTree([])
    with pytest.raises(ValueError, match="duplicate"):
        merkle.MerkleTree(_leaves(2) * 2)


def test_two_leaf_root_is_the_sorted_pair_hash() -> None:
    a, b = _leaves(2)
    expected = keccak(min(a, b) + max(a, b))
    assert merkle.MerkleTree([a, b]).root == expected


def test_leaf_encoding_matches_the_contract(env: Env) -> None:
    provider = env.providers[0]
    for token, amount in ((NATIVE, 1), (env.token.address, 123_456_789), (NATIVE, 2**255)):
        on_chain = env.client.escrow.functions.leafHash(provider, token, amount).call()
        assert bytes(on_chain) == merkle.leaf_hash(provider, token, amount)


def test_leaf_hash_rejects_out_of_range_amounts() -> None:
    with pytest.raises(ValueError):
        merkle.leaf_hash(NATIVE, NATIVE, -1)
