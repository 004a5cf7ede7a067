from __future__ import annotations

from collections.abc import Iterator

import pytest

# The chain extra (web3, eth-tester) is optional: without it these tests cannot run at all.
pytest.importorskip("web3")
pytest.importorskip("eth_tester")

from contracts import ChainClient, Deployment
from tests.contracts.chain_env import STABLE_DECIMALS, Env

# Every chain test runs twice: on the in-process EVM, and through JSON-RPC on Hardhat's node
# with the operator signing locally (ChainClient.from_url, as in production).
BACKENDS = ["embedded", "rpc"]


def _client(backend: str, request: pytest.FixtureRequest) -> ChainClient:
    if backend == "embedded":
        return ChainClient.embedded()
    node = request.getfixturevalue("rpc_chain")
    deployment = Deployment.from_json(node.deployment_json)
    return ChainClient.from_url(node.url, deployment, node.operator_key, admin=node.admin)


@pytest.fixture(scope="session", params=BACKENDS)
def _deployed(request: pytest.FixtureRequest) -> Env:
    client = _client(request.param, request)
    accounts = client.w3.eth.accounts
    admin, operator = accounts[0], client.operator
    token = client.deploy_contract("MockERC20", "Test USD", "TUSD", STABLE_DECIMALS, sender=admin)
    client.allow_token(token.address)
    buyer, buyer2, outsider = accounts[2], accounts[3], accounts[4]
    for who in (buyer, buyer2, outsider):
        client.transact(token.functions.mint(who, 1_000_000 * 10**STABLE_DECIMALS), admin)
    return Env(client, token, admin, operator, buyer, buyer2, list(accounts[5:10]), outsider)


@pytest.fixture
def env(_deployed: Env) -> Iterator[Env]:
    # One deployment per backend for the session; every test starts from the same snapshot.
    w3 = _deployed.client.w3
    snapshot = w3.testing.snapshot()
    yield _deployed
    w3.testing.revert(snapshot)
