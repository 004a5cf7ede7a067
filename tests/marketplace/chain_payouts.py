"""Helpers for the ledger-with-chain tests: the chain as the marketplace is configured to
reach it, and a provider payout earned from a buyer's on-chain deposit."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from contracts import ChainClient, Deployment
from contracts.hardhat_node import RpcChain
from marketplace.ledger import chain as ledger_chain
from tests.marketplace.helpers import client_for
from tests.marketplace.test_ledger_jobs import work_all

UPC = 10**12  # wei per credit


def configure_rpc(settings: Any, node: RpcChain, url: str | None = None) -> None:
    """The settings production reads from GPUFLEX_CHAIN_URL, _DEPLOYMENT and _OPERATOR_KEY."""
    settings.CHAIN = settings.CHAIN | {
        "URL": url or node.url,
        "DEPLOYMENT": node.deployment_json,
        "OPERATOR_KEY": node.operator_key,
        "UNITS_PER_CREDIT": UPC,
    }


def direct_client(node: RpcChain) -> ChainClient:
    """The test's own view of the node, past any proxy."""
    deployment = Deployment.from_json(node.deployment_json)
    return ChainClient.from_url(node.url, deployment, node.operator_key, admin=node.admin)


def restart() -> ChainClient:
    """As after a process restart: nothing in memory, the client built from settings."""
    ledger_chain.use_client(None)
    client = ledger_chain.chain_client()
    assert client is not None
    return client


def register_wallet(client: Any, address: str) -> dict[str, Any]:
    response = client.put("/api/v1/ledger/wallet", {"address": address}, format="json")
    assert response.status_code == 200, response.content
    return dict(response.json())


def earn_and_request_payout(
    chain: ChainClient, make_user: Any, make_agent: Any, provider: Any, provider_addr: str
) -> dict[str, Any]:
    """A buyer deposits 30 credits on chain, a job spends some on the provider's three nodes,
    and the provider asks for all its earnings to `provider_addr`: one requested payout."""
    buyer_addr = chain.w3.eth.accounts[2]
    _, buyer_key = make_user("buyer")
    buyer = client_for(buyer_key)
    funding = register_wallet(buyer, buyer_addr)["funding_id"]
    register_wallet(provider, provider_addr)
    chain.deposit(funding, 30 * UPC, sender=buyer_addr)
    assert ledger_chain.sync_deposits(chain) == 1
    earned = earn_from_a_paid_job(buyer, provider, make_agent)
    request = {"amount": str(earned), "wallet_address": provider_addr, "idempotency_key": "p1"}
    response = provider.post("/api/v1/payouts/", request, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json()) | {"funding_id": funding}


def earn_from_a_paid_job(buyer: Any, provider: Any, make_agent: Any) -> Decimal:
    """The buyer's one-round job on three of the provider's platform nodes at 600 credits an
    hour: returns what the provider earned."""
    agents = [make_agent(kind="platform", price="600") for _ in range(3)]
    body = {"spec": {"name": "paid", "dataset": {"kind": "digits"}, "local": {"steps": 4},
                     "rounds": {"max_rounds": 1}, "sharding": {"method": "stratified",
                                                               "num_shards": 3}},
            # each lease reserves its most (600/h x the lease timeout): the budget must hold
            # all three at once (docs/money.md, reservations); what is unspent comes back
            "tier": "platform", "budget": "500", "max_price_per_gpu_hour": "1000"}  # fmt: skip
    assert buyer.post("/api/v1/jobs/", body, format="json").status_code == 201
    work_all(agents)
    earned = Decimal(provider.get("/api/v1/ledger/earnings").json()["balance"])
    assert earned > Decimal("0.5")
    return earned
