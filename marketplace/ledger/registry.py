"""Providers in the NodeRegistry: the wallet a provider links, with a hash of its nodes'
capabilities, registered on chain by the operator (`registerFor`: the marketplace holds no
provider key) once the link commits, exactly once (chain_once.send_once), and again when the
hash changes (a relinked wallet after new nodes enrolled). With the chain disabled, nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging

from marketplace.accounts.models import User
from marketplace.ledger.anchoring import chain_enabled
from marketplace.ledger.models import NodeRegistration
from marketplace.nodes.models import Node

log = logging.getLogger(__name__)


def capability_hash(user: User) -> str | None:
    """sha256 over the canonical JSON of the user's nodes' capabilities (None without nodes):
    anyone holding the same facts (the nodes' API detail) recomputes it."""
    nodes = [
        {
            "node": n.pk,
            "gpu_model": n.gpu_model,
            "memory_gb": n.memory_gb,
            "fp32_tflops": (n.benchmark or {}).get("fp32_tflops"),
            "isolation": (n.hardware or {}).get("isolation"),
        }
        for n in Node.objects.filter(owner=user).order_by("pk")
    ]
    if not nodes:
        return None
    text = json.dumps(nodes, sort_keys=True, separators=(",", ":"))
    return "0x" + hashlib.sha256(text.encode()).hexdigest()


def request_registration(user: User, address: str) -> NodeRegistration | None:
    """Inside the transaction that links `address` to `user`: store the registration; the
    caller sends it once that commits (ledger.tasks.enqueue_registration)."""
    digest = capability_hash(user) if chain_enabled() else None
    if digest is None:
        return None
    registration, _ = NodeRegistration.objects.get_or_create(
        address=address, capability_hash=digest, defaults={"user": user}
    )
    return registration


def send_registration(pk: int) -> NodeRegistration | None:
    from contracts import ChainError
    from marketplace.ledger.chain import chain_client
    from marketplace.ledger.chain_once import send_once

    client = chain_client()
    reg = NodeRegistration.objects.filter(pk=pk).first()
    if client is None or reg is None or reg.registered or reg.failed:
        return reg
    digest = bytes.fromhex(reg.capability_hash[2:])
    try:
        sent = send_once(
            client,
            reg,
            "nonce",
            lambda: client.node(reg.address).capability_hash == digest,
            lambda n: client.register_node_for(reg.address, digest, n),
        )
    except ChainError as exc:  # NodeInactive: the operator deactivated that address
        reg.failed = str(exc)[:300]
        reg.save(update_fields=["failed"])
        log.error("registering %s failed: %s", reg.address, exc)
        return reg
    if sent == "pending":
        return reg
    reg.registered = True
    if not isinstance(sent, str):
        reg.tx_hash = "0x" + bytes(sent["transactionHash"]).hex()
    reg.save(update_fields=["registered", "tx_hash"])
    return reg


def send_pending() -> int:
    done = 0
    for pk in NodeRegistration.objects.filter(registered=False, failed="").values_list(
        "pk", flat=True
    ):
        reg = send_registration(pk)
        done += bool(reg and reg.registered)
    return done
