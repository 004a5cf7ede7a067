"""Deploying the three contracts and describing where they live."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address
from web3 import Web3

from contracts.artifacts import ESCROW, NODE_REGISTRY, PROVENANCE, load_artifact
from contracts.errors import REVERTS, from_web3_error


@dataclass(frozen=True)
class Deployment:
    """Addresses of a deployed set; ``from_block`` is where event scans can start."""

    escrow: ChecksumAddress
    node_registry: ChecksumAddress
    provenance: ChecksumAddress
    from_block: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Deployment:
        data: dict[str, Any] = json.loads(text)
        return cls(
            escrow=to_checksum_address(data["escrow"]),
            node_registry=to_checksum_address(data["node_registry"]),
            provenance=to_checksum_address(data["provenance"]),
            from_block=int(data["from_block"]),
        )


def deploy_contract(w3: Web3, name: str, sender: str, *args: Any) -> ChecksumAddress:
    artifact = load_artifact(name)
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    try:
        tx_hash = factory.constructor(*args).transact({"from": sender})
    except REVERTS as exc:
        raise from_web3_error(exc) from exc
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
    if receipt["status"] != 1 or receipt["contractAddress"] is None:
        raise RuntimeError(f"deploying {name} failed")
    return to_checksum_address(receipt["contractAddress"])


def deploy(w3: Web3, deployer: str, admin: str, operator: str) -> Deployment:
    """Deploy escrow, node registry and provenance registry; ``admin`` manages roles,
    ``operator`` settles, refunds and anchors. ``deployer`` only pays for the deployment."""
    start = w3.eth.block_number
    args = (to_checksum_address(admin), to_checksum_address(operator))
    return Deployment(
        escrow=deploy_contract(w3, ESCROW, deployer, *args),
        node_registry=deploy_contract(w3, NODE_REGISTRY, deployer, *args),
        provenance=deploy_contract(w3, PROVENANCE, deployer, *args),
        from_block=start,
    )
