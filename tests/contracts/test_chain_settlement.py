"""Off-chain settlement batches and id encoding (no transactions)."""

from __future__ import annotations

from uuid import UUID

import pytest
from eth_abi import encode
from eth_utils import function_signature_to_4byte_selector as selector
from eth_utils import keccak

from contracts import JobDebit, Payout, SettlementBatch, merkle, to_bytes32
from contracts.errors import decode_revert
from contracts.records import NATIVE

P1 = "0x1111111111111111111111111111111111111111"
P2 = "0x2222222222222222222222222222222222222222"


def test_batch_aggregates_per_provider_and_serves_valid_proofs() -> None:
    batch = SettlementBatch.build(
        "b", [Payout(P1, 5), Payout(P2, 7), Payout(P1.lower(), 3)], [JobDebit("j", 15)]
    )
    assert batch.total == 15 and batch.amount_for(P1) == 8
    for provider in (P1, P2):
        proof = batch.proof_for(provider)
        leaf = merkle.leaf_hash(proof.provider, NATIVE, proof.amount)
        assert merkle.verify(proof.proof, batch.root, leaf)
    with pytest.raises(KeyError):
        batch.proof_for("0x3333333333333333333333333333333333333333")


def test_batch_round_trips_through_json() -> None:
    batch = SettlementBatch.build("b", [Payout(P1, 5), Payout(P2, 7)], [JobDebit("j", 12)])
    again = SettlementBatch.from_json(batch.to_json())
    assert again == batch and again.root == batch.root
    assert again.proof_for(P2) == batch.proof_for(P2)
    tampered = batch.to_json().replace('"5"', '"6"')
    with pytest.raises(ValueError):
        SettlementBatch.from_json(tampered)


@pytest.mark.parametrize(
    ("payouts", "debits", "message"),
    [
        ([Payout(P1, 5)], [JobDebit("j", 4)], "differ"),
        ([Payout(P1, 0)], [JobDebit("j", 0)], "positive"),
        ([], [], "at least one"),
        ([Payout(NATIVE, 5)], [JobDebit("j", 5)], "zero address"),
        ([Payout(P1, 5)], [JobDebit("j", -5), JobDebit("k", 10)], "positive"),
    ],
)
def test_inconsistent_batches_are_refused(
    payouts: list[Payout], debits: list[JobDebit], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SettlementBatch.build("b", payouts, debits)


def test_to_bytes32() -> None:
    uid = UUID("12345678-1234-5678-1234-567812345678")
    assert to_bytes32(uid) == uid.int.to_bytes(32, "big")
    assert to_bytes32(7) == (7).to_bytes(32, "big")
    assert to_bytes32("job-7") == keccak(text="job-7")
    assert to_bytes32("0x" + "ab" * 32) == b"\xab" * 32
    assert to_bytes32(b"\x01" * 32) == b"\x01" * 32
    for bad in (b"short", -1, 2**256):
        with pytest.raises(ValueError):
            to_bytes32(bad)
    with pytest.raises(TypeError):
        to_bytes32(True)


def test_reverts_are_named() -> None:
    data = selector("AlreadyClaimed(bytes32,address)") + encode(
        ["bytes32", "address"], [b"\1" * 32, P1]
    )
    err = decode_revert(data)
    assert (err.name, err.error_args) == ("AlreadyClaimed", (b"\1" * 32, P1))
    assert decode_revert(selector("Panic(uint256)") + encode(["uint256"], [0x11])).name == "Panic"
    assert decode_revert(selector("Error(string)") + encode(["string"], ["no"])).error_args == (
        "no",
    )
    assert decode_revert(b"\xde\xad\xbe\xef").name == "Unknown"
