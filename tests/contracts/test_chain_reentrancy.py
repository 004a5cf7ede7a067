"""A receiver that calls back into the escrow while being paid gets nothing extra.

The attacker (contracts/src/test/ReentrantReceiver.sol) records how its re-entry ended, so
these tests check that ReentrancyGuard itself refused it, not some later check by luck.
"""

from __future__ import annotations

import pytest
from eth_utils import function_signature_to_4byte_selector
from web3.contract import Contract

from contracts import ChainError, JobDebit, Payout, SettlementBatch, to_bytes32
from contracts.client import OPERATOR_ROLE
from tests.contracts.chain_env import Env

GUARD = function_signature_to_4byte_selector("ReentrancyGuardReentrantCall()")


def _attacker(env: Env) -> Contract:
    return env.client.deploy_contract(
        "ReentrantReceiver", env.client.escrow.address, sender=env.admin
    )


def _calldata(contract: Contract, fn: str, *args: object) -> bytes:
    return bytes.fromhex(contract.encode_abi(fn, args=list(args))[2:])


def test_reentering_claim_is_blocked(env: Env) -> None:
    c = env.client
    attacker = _attacker(env)
    c.deposit("job", 100, env.buyer)
    batch = SettlementBatch.build(
        "b", [Payout(attacker.address, 40), Payout(env.providers[0], 60)], [JobDebit("job", 100)]
    )
    c.post_batch(batch)
    proof = batch.proof_for(attacker.address)
    again = _calldata(
        c.escrow, "claim", proof.batch_id, proof.provider, proof.amount, list(proof.proof)
    )
    c.transact(attacker.functions.arm(again, False), env.outsider)

    c.claim(proof, sender=env.outsider)

    assert attacker.functions.attempts().call() == 1
    assert attacker.functions.reentrySucceeded().call() is False
    assert bytes(attacker.functions.reentryRevertData().call())[:4] == GUARD
    assert attacker.functions.received().call() == 40
    assert env.balance(attacker.address) == 40
    assert c.batch_state("b").claimed == 40  # type: ignore[union-attr]
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        c.claim(proof, sender=env.outsider)


def test_reentering_refund_is_blocked_even_for_an_operator(env: Env) -> None:
    # Worst case: the receiver holds the operator role, so only the guard stands in its way.
    c = env.client
    attacker = _attacker(env)
    c.transact(c.escrow.functions.grantRole(OPERATOR_ROLE, attacker.address), env.admin)
    c.deposit("victim", 500, env.buyer2)
    c.transact(attacker.functions.depositNative(to_bytes32("job")), env.outsider, value=100)
    assert c.job("job").buyer == attacker.address
    c.transact(
        attacker.functions.arm(_calldata(c.escrow, "refund", to_bytes32("victim")), False),
        env.outsider,
    )

    assert c.refund("job").amount == 100

    assert attacker.functions.reentrySucceeded().call() is False
    assert bytes(attacker.functions.reentryRevertData().call())[:4] == GUARD
    assert env.balance(attacker.address) == 100
    assert c.job("victim").remaining == 500 and not c.job("victim").closed


def test_a_receiver_that_reverts_fails_its_own_payment_only(env: Env) -> None:
    c = env.client
    attacker = _attacker(env)
    c.deposit("job", 100, env.buyer)
    batch = SettlementBatch.build("b", [Payout(attacker.address, 100)], [JobDebit("job", 100)])
    c.post_batch(batch)
    proof = batch.proof_for(attacker.address)
    again = _calldata(
        c.escrow, "claim", proof.batch_id, proof.provider, proof.amount, list(proof.proof)
    )
    c.transact(attacker.functions.arm(again, True), env.outsider)
    # The guard's revert makes the receiver revert, which the escrow reports as a failed transfer.
    with pytest.raises(ChainError, match="NativeTransferFailed"):
        c.claim(proof, sender=env.outsider)
    # Nothing moved and the claim is still open: disarmed, it can be claimed normally.
    assert env.balance(attacker.address) == 0
    assert not c.is_claimed(proof)
    c.transact(attacker.functions.arm(b"", False), env.outsider)
    c.claim(proof, sender=env.outsider)
    assert env.balance(attacker.address) == 100
