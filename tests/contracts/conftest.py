from __future__ import annotations

from collections.abc import Iterator

import pytest

# The chain extra (web3, eth-tester) is optional: without it these tests cannot run at all.
pytest.importorskip("web3")
pytest.importorskip("eth_tester")

from contracts import ChainClient
from tests.contracts.chain_env import STABLE_DECIMALS, Env


@pytest.fixture(scope="session")
def _deployed() -> Env:
    client = ChainClient.embedded()
    accounts = client.w3.eth.accounts
    admin, operator = accounts[0], accounts[1]
    token = client.deploy_contract("MockERC20", "Test USD", "TUSD", STABLE_DECIMALS, sender=admin)
    client.allow_token(token.address)
    buyer, buyer2, outsider = accounts[2], accounts[3], accounts[4]
    for who in (buyer, buyer2, outsider):
        client.transact(token.functions.mint(who, 1_000_000 * 10**STABLE_DECIMALS), admin)
    return Env(client, token, admin, operator, buyer, buyer2, list(accounts[5:10]), outsider)


@pytest.fixture
def env(_deployed: Env) -> Iterator[Env]:
    # One deployment for the session; every test starts from the same snapshot of it.
    w3 = _deployed.client.w3
    snapshot = w3.testing.snapshot()
    yield _deployed
    w3.testing.revert(snapshot)
