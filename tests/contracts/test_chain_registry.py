"""Node registry and provenance anchors."""

from __future__ import annotations

import pytest
from eth_utils import keccak

from contracts import ChainError, to_bytes32
from tests.contracts.chain_env import Env

CAP = keccak(text="RTX 4090 / 24 GiB / bench 812")


def test_node_registers_updates_and_is_deactivated_by_the_operator(env: Env) -> None:
    c, node = env.client, env.providers[0]
    start = c.block_number + 1
    assert c.node(node).registered_at_block == 0
    c.register_node(CAP, node)
    info = c.node(node)
    assert (info.capability_hash, info.active) == (CAP, True) and info.registered_at_block > 0
    c.register_node(keccak(text="upgraded"), node)
    assert c.node(node).capability_hash == keccak(text="upgraded")

    c.deactivate_node(node)
    assert not c.node(node).active
    with pytest.raises(ChainError, match="NodeInactive"):  # cannot re-register its way back
        c.register_node(CAP, node)
    with pytest.raises(ChainError, match="NodeInactive"):
        c.deactivate_node(node)
    c.reactivate_node(node)
    assert c.node(node).active

    events = c.nodes.events
    assert len(events.NodeRegistered().get_logs(from_block=start)) == 1
    assert len(events.NodeUpdated().get_logs(from_block=start)) == 1
    assert len(events.NodeDeactivated().get_logs(from_block=start)) == 1
    assert len(events.NodeReactivated().get_logs(from_block=start)) == 1


def test_node_registry_rules(env: Env) -> None:
    c = env.client
    with pytest.raises(ChainError, match="ZeroCapability"):
        c.register_node(b"\0" * 32, env.providers[0])
    with pytest.raises(ChainError, match="UnknownNode"):
        c.deactivate_node(env.providers[1])
    with pytest.raises(ChainError, match="AccessControlUnauthorizedAccount"):
        c.transact(c.nodes.functions.deactivate(env.providers[0]), env.providers[0])


def _records(n: int) -> dict[int, bytes]:
    return {r: keccak(text=f"round {r} provenance record") for r in range(1, n + 1)}


def test_anchors_are_append_only_and_verifiable(env: Env) -> None:
    c = env.client
    records = _records(3)
    start = c.block_number + 1
    for round_, digest in records.items():
        anchored = c.anchor("job", round_, digest)
        assert (anchored.round, anchored.record_hash) == (round_, digest)
    assert c.verify_history("job", records)
    assert c.provenance.functions.anchorCount(to_bytes32("job")).call() == 3

    # Rewriting history is refused, whether with a new hash or the same one.
    for digest in (keccak(text="rewritten"), records[2]):
        with pytest.raises(ChainError, match="AlreadyAnchored"):
            c.anchor("job", 2, digest)
    assert c.anchored("job", 2).record_hash == records[2]  # type: ignore[union-attr]

    tampered = {**records, 2: keccak(text="rewritten")}
    assert not c.verify_history("job", tampered)
    assert not c.verify_anchor("job", 4, keccak(text="never anchored"))
    assert not c.verify_anchor("other-job", 1, records[1])
    assert c.anchored("job", 99) is None

    logs = c.provenance.events.ProvenanceAnchored().get_logs(from_block=start)
    assert [(e["args"]["round"], bytes(e["args"]["recordHash"])) for e in logs] == list(
        records.items()
    )


def test_anchor_rules(env: Env) -> None:
    c = env.client
    with pytest.raises(ChainError, match="ZeroRecordHash"):
        c.anchor("job", 1, b"\0" * 32)
    assert not c.verify_anchor("job", 1, b"\0" * 32)
