"""The production path: an operator that signs locally with its own key (no unlocked account)."""

from __future__ import annotations

import pytest
from eth_account import Account

from contracts import ChainClient, ChainError, JobDebit, Payout, SettlementBatch, deploy
from contracts.connection import add_signer, embedded_web3, rpc_web3


def test_operator_with_a_private_key_settles_and_refunds() -> None:
    w3 = embedded_web3()
    key = "0x" + "42" * 32
    operator = add_signer(w3, key)
    assert operator not in w3.eth.accounts
    admin, buyer, provider = w3.eth.accounts[0], w3.eth.accounts[2], w3.eth.accounts[3]
    w3.eth.wait_for_transaction_receipt(
        w3.eth.send_transaction({"from": admin, "to": operator, "value": 10**18})
    )
    client = ChainClient(w3, deploy(w3, admin, admin, operator), operator=operator)

    client.deposit("job", 1_000, buyer)
    batch = SettlementBatch.build("b", [Payout(provider, 600)], [JobDebit("job", 600)])
    client.post_batch(batch)
    client.claim(batch.proof_for(provider))
    assert client.refund("job").amount == 400
    with pytest.raises(ChainError, match="NoAdmin"):
        client.allow_token(admin)


def test_rpc_web3_wants_an_http_url() -> None:
    with pytest.raises(ValueError):
        rpc_web3("ws://localhost:8546")
    w3, address = rpc_web3("http://127.0.0.1:1", "0x" + "42" * 32)  # no connection is made yet
    assert address == Account.from_key("0x" + "42" * 32).address
    assert w3.provider is not None
