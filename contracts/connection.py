"""Getting a ``Web3``: the in-process EVM by default, or any JSON-RPC endpoint by URL."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from web3 import EthereumTesterProvider, Web3
from web3.middleware import SignAndSendRawMiddlewareBuilder


def embedded_web3() -> Web3:
    """A fresh in-process chain (eth-tester on py-evm): funded, unlocked test accounts, one block
    per transaction. Nothing persists when the process exits."""
    return Web3(EthereumTesterProvider())


def rpc_web3(url: str, private_key: str | None = None) -> tuple[Web3, ChecksumAddress | None]:
    """A JSON-RPC connection (``http(s)://``). With a private key, transactions from its address
    are signed locally and sent raw, so the node never holds the key; returns the Web3 and that
    address."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"expected an http(s) JSON-RPC URL, got {url!r}")
    w3 = Web3(Web3.HTTPProvider(url))
    if private_key is None:
        return w3, None
    return w3, add_signer(w3, private_key)


def add_signer(w3: Web3, private_key: str) -> ChecksumAddress:
    """Sign transactions ``from`` the key's address locally (any provider, the embedded one
    included); returns the address."""
    account: LocalAccount = Account.from_key(private_key)
    w3.middleware_onion.inject(SignAndSendRawMiddlewareBuilder.build(account), layer=0)
    return account.address
