"""The ledger with the escrow contract on an in-process EVM: deposits credited once, payouts
settled in a Merkle batch and claimed with the proof the API serves, and reconciliation."""

from __future__ import annotations

from decimal import Decimal

import pytest

pytest.importorskip("eth_tester")

from contracts import ChainClient, ChainError, ClaimProof
from marketplace.ledger import accounts
from marketplace.ledger import chain as ledger_chain
from marketplace.ledger.models import ChainDeposit, Payout
from marketplace.ledger.posting import balance
from marketplace.ledger.reconcile import reconcile
from tests.marketplace.chain_payouts import UPC, configure_rpc, earn_from_a_paid_job, restart
from tests.marketplace.helpers import client_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["embedded", "rpc"])
def chain(request, settings):
    """The in-process EVM, or Hardhat's JSON-RPC node reached exactly as production reaches a
    chain (settings from GPUFLEX_CHAIN_URL and friends, the client built by chain_client)."""
    settings.GPUFLEX = settings.GPUFLEX | {"MIN_PAYOUT": "0.01"}
    if request.param == "embedded":
        settings.CHAIN = settings.CHAIN | {"URL": "embedded", "UNITS_PER_CREDIT": UPC}
        client = ChainClient.embedded()
        ledger_chain.use_client(client)
        yield client
        ledger_chain.use_client(None)
        return
    configure_rpc(settings, request.getfixturevalue("rpc_chain"))
    client = restart()
    snapshot = client.w3.testing.snapshot()  # the node lives for the session
    yield client
    client.w3.testing.revert(snapshot)
    ledger_chain.use_client(None)


def _wallet(client, address: str) -> dict:
    response = client.put("/api/v1/ledger/wallet", {"address": address}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_deposit_spend_settle_claim_and_reconcile(chain, make_user, make_agent, provider):
    w3 = chain.w3
    buyer_addr, provider_addr, stranger = w3.eth.accounts[2], w3.eth.accounts[3], w3.eth.accounts[4]
    buyer_user, buyer_key = make_user("buyer")
    buyer = client_for(buyer_key)
    funding = _wallet(buyer, buyer_addr)["funding_id"]
    _wallet(provider, provider_addr)

    chain.deposit(funding, 30 * UPC, sender=buyer_addr)
    with pytest.raises(ChainError, match="NotJobBuyer"):  # the id is bound to its first payer
        chain.deposit(funding, 5 * UPC, sender=stranger)
    assert ledger_chain.sync_deposits(chain) == 1 and ledger_chain.sync_deposits(chain) == 0
    assert balance(accounts.buyer_credit(buyer_user)) == Decimal("1030")  # 1000 granted + 30
    assert reconcile().ok, reconcile().problems

    earned = earn_from_a_paid_job(buyer, provider, make_agent)

    request = {"amount": str(earned), "wallet_address": provider_addr, "idempotency_key": "p1"}
    payout = provider.post("/api/v1/payouts/", request, format="json").json()

    def refuse(batch, nonce=None):
        raise ChainError("InsufficientEscrow", (), "simulated")

    real_post, chain.post_batch = chain.post_batch, refuse
    refused = ledger_chain.settle_payouts(chain)
    assert refused is not None and refused.failed.startswith("InsufficientEscrow")
    assert Payout.objects.get(pk=payout["id"]).status == "requested"
    assert reconcile().ok, reconcile().problems
    chain.post_batch = real_post

    record = ledger_chain.settle_payouts(chain)
    assert record is not None and record.posted and not record.failed
    assert ledger_chain.settle_payouts(chain) is None  # nothing left to settle
    assert Payout.objects.get(pk=payout["id"]).status == "batched"

    proof = provider.get(f"/api/v1/payouts/{payout['id']}/proof").json()
    escrow_before = w3.eth.get_balance(chain.escrow.address)
    claim = ClaimProof(
        batch_id=bytes.fromhex(proof["batch_id"][2:]),
        provider=proof["provider"],
        token=proof["token"],
        amount=int(proof["amount"]),
        proof=tuple(bytes.fromhex(p[2:]) for p in proof["proof"]),
    )
    claimed = chain.claim(claim, sender=provider_addr)
    assert claimed.amount == int(proof["amount"]) == int(earned * UPC)
    assert escrow_before - w3.eth.get_balance(chain.escrow.address) == claimed.amount
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        chain.claim(claim, sender=provider_addr)

    report = reconcile()
    assert report.ok, report.problems
    assert "the ledger agrees with the escrow contract" in report.checked


def test_reconcile_sees_a_deposit_the_ledger_has_not_credited(chain, make_user) -> None:
    user, key = make_user("buyer")
    funding = _wallet(client_for(key), chain.w3.eth.accounts[5])["funding_id"]
    chain.deposit(funding, 2 * UPC, sender=chain.w3.eth.accounts[5])
    problems = reconcile().problems
    assert problems == []  # the ledger knows no funding ids yet: nothing to compare
    ledger_chain.sync_deposits(chain)
    chain.deposit(funding, 3 * UPC, sender=chain.w3.eth.accounts[5])
    problems = " ".join(reconcile().problems)
    assert "the chain holds deposits of 5000000000000" in problems
    ledger_chain.sync_deposits(chain)
    assert reconcile().ok
    assert ChainDeposit.objects.filter(user=user).count() == 2
