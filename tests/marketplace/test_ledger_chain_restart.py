"""A connection dropped mid-settlement, on Hardhat's JSON-RPC node: the marketplace reaches the
node through a proxy that hangs up around the batch's eth_sendRawTransaction, the process
"restarts" (a fresh client from settings) and settles again. Each payout is paid exactly once,
nothing is lost, and the ledger reconciles with the chain."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("web3")

from contracts import ChainClient, ChainError, ClaimProof
from marketplace.ledger import chain as ledger_chain
from marketplace.ledger.models import Payout, ProvenanceAnchor, SettlementRecord
from marketplace.ledger.reconcile import reconcile
from tests.marketplace.chain_payouts import (
    configure_rpc,
    direct_client,
    earn_and_request_payout,
    restart,
)
from tests.marketplace.rpc_proxy import CuttableRpcProxy

pytestmark = pytest.mark.django_db(transaction=True)
SEND = "eth_sendRawTransaction"


@dataclass
class Link:
    proxy: CuttableRpcProxy  # what the marketplace talks to (GPUFLEX_CHAIN_URL)
    node: ChainClient  # the test's own view of the chain, never cut

    base: int = 0  # transactions sent before the settlement under test (the job's anchor)

    def sends(self) -> int:
        return self.proxy.forwarded.count(SEND) - self.base

    def mine(self) -> None:
        self.node.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def set_automine(self, on: bool) -> None:
        self.node.w3.provider.make_request("evm_setAutomine", [on])  # type: ignore[arg-type]


@pytest.fixture
def link(rpc_chain, settings) -> Iterator[Link]:
    settings.GPUFLEX = settings.GPUFLEX | {"MIN_PAYOUT": "0.01"}
    node = direct_client(rpc_chain)
    snapshot = node.w3.testing.snapshot()  # the node lives for the session
    with CuttableRpcProxy(rpc_chain.url) as proxy:
        configure_rpc(settings, rpc_chain, url=proxy.url)
        here = Link(proxy, node)
        yield here
        ledger_chain.use_client(None)
        here.set_automine(True)
        node.w3.testing.revert(snapshot)


def _proof(payout_id: int, provider_api) -> ClaimProof:
    proof = provider_api.get(f"/api/v1/payouts/{payout_id}/proof").json()
    return ClaimProof(
        batch_id=bytes.fromhex(proof["batch_id"][2:]),
        provider=proof["provider"],
        token=proof["token"],
        amount=int(proof["amount"]),
        proof=tuple(bytes.fromhex(p[2:]) for p in proof["proof"]),
    )


@pytest.mark.parametrize(
    "case",
    [
        "mined",  # the node mined the batch; only its answer was lost
        "pending",  # the node holds the batch unmined when the process comes back
        "never-arrived",  # the link broke before the transaction reached the node
    ],
)
def test_a_dropped_connection_mid_settlement_pays_each_payout_once(
    case, link, make_user, make_agent, provider
) -> None:
    provider_addr = link.node.w3.eth.accounts[6]
    payout = earn_and_request_payout(restart(), make_user, make_agent, provider, provider_addr)
    funding = payout["funding_id"]
    units = link.node.job(funding).deposited  # 30 credits deposited, none settled yet
    assert link.node.job(funding).settled == 0

    # the one-round job completed: its provenance head was anchored through the same link
    assert link.sends() == 1 and ProvenanceAnchor.objects.get().anchored
    link.base = link.sends()
    if case == "pending":
        link.set_automine(False)
    link.proxy.cut_at(SEND, forward=case != "never-arrived")
    with pytest.raises(OSError):  # requests' ConnectionError, after web3's own retries
        ledger_chain.settle_payouts(restart())
    assert link.proxy.is_down
    record = SettlementRecord.objects.get()
    assert not record.posted and not record.failed
    assert Payout.objects.get(pk=payout["id"]).status == "batched"
    assert link.sends() == (0 if case == "never-arrived" else 1)

    link.proxy.restore()
    if case == "pending":
        # Back up while the batch waits unmined in the node's pool (the node mines new
        # transactions again): nothing is sent a second time, the batch is left in flight.
        link.set_automine(True)
        assert ledger_chain.settle_payouts(restart()) is None
        assert link.sends() == 1
        assert not SettlementRecord.objects.get().posted
        assert any("not on chain yet" in p for p in reconcile().problems)
        link.mine()

    assert ledger_chain.settle_payouts(restart()) is None  # finishes the batch, nothing new
    record.refresh_from_db()
    assert record.posted and not record.failed and record.gas_used and record.tx_hash
    # two transactions in all, the batch and then its contribution root: the batch resent
    # only when it never arrived
    assert link.sends() == 2 and record.anchored
    assert SettlementRecord.objects.count() == 1
    anchored = link.node.provenance.events.ContributionsAnchored().get_logs(
        from_block=link.node.deployment.from_block
    )
    assert [bytes(e["args"]["batchId"]).hex() for e in anchored] == [record.batch_id[2:]]
    posted = link.node.escrow.events.BatchPosted().get_logs(
        from_block=link.node.deployment.from_block
    )
    assert [bytes(e["args"]["batchId"]).hex() for e in posted] == [record.batch_id[2:]]
    amount = int(record.total_units)
    assert link.node.job(funding).settled == amount and link.node.job(funding).deposited == units

    report = reconcile()
    assert report.ok, report.problems
    claim = _proof(payout["id"], provider)
    escrow = link.node.escrow.address
    before = link.node.w3.eth.get_balance(escrow)
    assert link.node.claim(claim, sender=link.node.w3.eth.accounts[0]).amount == amount
    assert before - link.node.w3.eth.get_balance(escrow) == amount
    with pytest.raises(ChainError, match="AlreadyClaimed"):
        link.node.claim(claim, sender=link.node.w3.eth.accounts[0])
    assert reconcile().ok
