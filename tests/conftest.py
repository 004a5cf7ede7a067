from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from contracts.hardhat_node import RpcChain

# pytest-xdist runs one worker per core; torch's own intra-op threads on top of that
# oversubscribe the cores and make small-tensor training many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def rpc_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RpcChain]:
    """Hardhat's JSON-RPC node with the contracts deployed, one per xdist worker, started on
    first use and stopped when the worker's session ends (contracts/hardhat_node.py)."""
    pytest.importorskip("web3")
    from contracts.hardhat_node import hardhat_chain, missing_reason

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with hardhat_chain(tmp_path_factory.mktemp("hardhat")) as chain:
        yield chain
