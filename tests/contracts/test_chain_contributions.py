"""Contribution roots anchored per settlement batch, and pull withdrawals to a contract buyer
that refuses native currency (claimTo)."""

from __future__ import annotations

import pytest
from eth_utils import keccak

from contracts import (
    ChainError,
    ContributionProof,
    ContributionTree,
    JobDebit,
    NodeContribution,
    Payout,
    SettlementBatch,
)
from contracts.merkle import contribution_leaf_hash
from tests.contracts.chain_env import ETH, Env


def _tree(batch: str, n: int = 5) -> ContributionTree:
    return ContributionTree.build(
        batch,
        [NodeContribution(f"node-{i}", i + 1, 32 * (i + 1), 10**12 * (i + 1)) for i in range(n)],
    )


def test_contribution_leaf_matches_the_contract(env: Env) -> None:
    c = env.client
    node = keccak(text="node")
    onchain = c.provenance.functions.contributionLeaf(node, 3, 96, 7 * 10**12).call()
    assert bytes(onchain) == contribution_leaf_hash(node, 3, 96, 7 * 10**12)


def test_contribution_root_is_anchored_once_and_every_node_can_prove_its_leaf(env: Env) -> None:
    c = env.client
    tree = _tree("batch-1")
    assert c.contributions_of("batch-1") is None
    c.anchor_contributions("batch-1", tree.root, len(tree.nodes))
    anchored = c.contributions_of("batch-1")
    assert anchored is not None and (anchored.root, anchored.leaves) == (tree.root, 5)
    for row in tree.nodes:
        proof = tree.proof_for(row.key())
        assert proof.verify() and c.verify_contribution(proof)
        assert ContributionProof.from_dict(proof.to_dict()) == proof

    # A leaf claiming more earnings, samples or contributions than the batch credited fails.
    good = tree.proof_for("node-2")
    for forged in (
        ContributionProof(**{**good.__dict__, "earnings": good.earnings + 1}),
        ContributionProof(**{**good.__dict__, "samples": good.samples * 2}),
        ContributionProof(**{**good.__dict__, "contributions": good.contributions + 1}),
        ContributionProof(**{**good.__dict__, "batch_id": keccak(text="other batch")}),
    ):
        assert not c.verify_contribution(forged)

    # Append-only: neither another root nor the same one can be anchored again.
    for root in (_tree("batch-1", 4).root, tree.root):
        with pytest.raises(ChainError, match="ContributionsAlreadyAnchored"):
            c.anchor_contributions("batch-1", root, 4)
    with pytest.raises(ChainError, match="ZeroRecordHash"):
        c.anchor_contributions("batch-2", b"\0" * 32, 1)
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(
            c.provenance.functions.anchorContributions(keccak(text="b3"), tree.root, 5),
            env.outsider,
        )


def test_tree_json_round_trip_and_rules() -> None:
    tree = _tree("batch-json")
    assert ContributionTree.from_json(tree.to_json()).root == tree.root
    merged = ContributionTree.build("b", [NodeContribution("n", 1, 2, 3)] * 2)
    assert merged.nodes == (NodeContribution(merged.nodes[0].key(), 2, 4, 6),)
    with pytest.raises(ValueError, match="at least one node"):
        ContributionTree.build("b", [])
    with pytest.raises(ValueError, match="negative"):
        ContributionTree.build("b", [NodeContribution("n", -1, 0, 0)])
    with pytest.raises(KeyError):
        tree.proof_for("node-99")


def test_a_buyer_contract_that_refuses_native_currency_withdraws_by_claim_to(env: Env) -> None:
    """Pull, not push: the refusing buyer's own claim fails and nothing else does; its leaf
    stays claimable, and claimTo (only the leaf's owner can call it) sends it elsewhere."""
    c = env.client
    rejecting = c.deploy_contract("RejectingBuyer", c.escrow.address, sender=env.buyer)
    fid = keccak(text="funding of a contract wallet")
    c.transact(rejecting.functions.depositNative(fid), env.buyer, value=3 * ETH)
    assert c.job(fid).buyer == rejecting.address

    # The operator batches the buyer's withdrawal (its own address) and a provider's payout.
    batch = SettlementBatch.build(
        "withdraw-batch",
        [Payout(rejecting.address, 2 * ETH), Payout(env.providers[0], ETH)],
        [JobDebit(fid, 3 * ETH)],
    )
    c.post_batch(batch)
    refund = batch.proof_for(rejecting.address)
    with pytest.raises(ChainError, match="NativeTransferFailed"):
        c.transact(
            rejecting.functions.claim(refund.batch_id, refund.amount, list(refund.proof)),
            env.buyer,
        )
    # The provider in the same batch is paid all the same.
    before = env.balance(env.providers[0])
    c.claim(batch.proof_for(env.providers[0]), sender=env.outsider)
    assert env.balance(env.providers[0]) - before == ETH
    assert not c.is_claimed(refund)

    # Nobody else can redirect the buyer's leaf: claimTo pays msg.sender's leaf only.
    with pytest.raises(ChainError, match="InvalidProof"):
        c.transact(
            c.escrow.functions.claimTo(
                refund.batch_id, refund.amount, list(refund.proof), env.outsider
            ),
            env.outsider,
        )
    before = env.balance(env.buyer2)
    c.transact(
        rejecting.functions.claimTo(refund.batch_id, refund.amount, list(refund.proof), env.buyer2),
        env.buyer,
    )
    assert env.balance(env.buyer2) - before == 2 * ETH and c.is_claimed(refund)
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        c.transact(
            rejecting.functions.claimTo(
                refund.batch_id, refund.amount, list(refund.proof), env.buyer2
            ),
            env.buyer,
        )
    assert c.batch_state("withdraw-batch").claimed == 3 * ETH  # type: ignore[union-attr]


def test_the_operator_registers_a_node_for_it_under_the_same_rules(env: Env) -> None:
    c, node = env.client, env.providers[2]
    cap = keccak(text="2x RTX 4090")
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(c.nodes.functions.registerFor(node, cap), env.outsider)
    c.register_node_for(node, cap)
    assert c.node(node).capability_hash == cap and c.node(node).active
    c.deactivate_node(node)
    with pytest.raises(ChainError, match="NodeInactive"):
        c.register_node_for(node, keccak(text="other"))
    with pytest.raises(ChainError, match="ZeroCapability"):
        c.register_node_for(env.providers[3], b"\0" * 32)
