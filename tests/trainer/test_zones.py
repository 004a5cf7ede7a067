"""Zone pre-aggregation: the partial-sum math, the wire format, the member tokens."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.hashing import state_hash
from trainer.provenance import Contribution, ProvenanceChain, record_round
from trainer.spec import AggregationSpec, SpecError, parse_spec
from trainer.updates import UpdateRejected, encode_state
from trainer.zones import (
    Member,
    PartialSum,
    combine,
    decode_partial,
    encode_partial,
    member_token,
    round_key,
    token_ok,
)


def _state(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(8, 5, generator=g) * scale,
        "b": torch.randn(5, generator=g) * scale,
    }


def _zones(count: int, per_zone: int) -> list[list[tuple[dict, int]]]:
    return [
        [(_state(10 * z + i, 0.1), 17 + 5 * i + z) for i in range(per_zone)] for z in range(count)
    ]


def _partial(zone: list[tuple[dict, int]], z: int) -> bytes:
    p = PartialSum()
    for i, (delta, n) in enumerate(zone):
        p.add(delta, Member(f"t{z}-{i}", f"n{z}-{i}", f"h{z}-{i}", n, {"loss": 0.5}))
    return encode_partial(p, job_id="job", round_id="r1", zone=f"z{z}")


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fedadam", "diloco"])
def test_zones_equal_flat_for_sample_weighted_strategies(strategy: str) -> None:
    zones = _zones(3, 8)
    global_state = _state(999)
    spec = AggregationSpec(strategy=strategy)
    flat_updates = [
        ClientUpdate(f"n{z}-{i}", d, n)
        for z, zone in enumerate(zones)
        for i, (d, n) in enumerate(zone)
    ]
    flat = build_strategy(spec).aggregate(global_state, flat_updates)
    decoded = [decode_partial(_partial(zone, z), global_state, 1e4) for z, zone in enumerate(zones)]
    zone_updates = [ClientUpdate(p.zone, p.mean, p.samples) for p in decoded]
    hier = build_strategy(spec).aggregate(global_state, zone_updates)
    for k in flat:
        torch.testing.assert_close(hier[k], flat[k], rtol=1e-5, atol=1e-6)
    # and the plain mean of means the module exposes agrees with it too
    means = combine((p.mean, p.samples) for p in decoded)
    total = sum(n for zone in zones for _, n in zone)
    direct = {
        k: sum(d[k].double() * n for zone in zones for d, n in zone) / total for k in global_state
    }
    for k in means:
        torch.testing.assert_close(means[k].double(), direct[k], rtol=1e-5, atol=1e-7)


def test_partial_carries_its_manifest() -> None:
    zone = _zones(1, 3)[0]
    decoded = decode_partial(_partial(zone, 0), _state(1), 1e4)
    assert decoded.samples == sum(n for _, n in zone)
    assert [m.task_id for m in decoded.members] == ["t0-0", "t0-1", "t0-2"]
    assert decoded.members[1].metrics == {"loss": 0.5}
    assert decoded.zone == "z0" and decoded.round_id == "r1"


def test_a_task_counts_once_in_a_partial() -> None:
    p = PartialSum()
    p.add(_state(1), Member("t1", "n1", "h", 3))
    with pytest.raises(ValueError, match="already"):
        p.add(_state(2), Member("t1", "n2", "h2", 3))


def _with_manifest(tensors: dict, manifest: dict) -> bytes:
    return encode_state(tensors, {"manifest": json.dumps(manifest)})


def test_partial_checks_norm_on_the_mean() -> None:
    reference = _state(1)
    big = {k: v * 0 + 100.0 for k, v in reference.items()}  # mean norm ~ 100 * sqrt(45)
    partial = PartialSum()
    partial.add(big, Member("t", "n", "h", 4))
    data = encode_partial(partial, job_id="j", round_id="r", zone="z")
    with pytest.raises(UpdateRejected) as exc:
        decode_partial(data, reference, max_norm=100.0)
    assert exc.value.reason == "norm"
    assert decode_partial(data, reference, max_norm=1e4).samples == 4


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ({"kind": "other"}, "not a zone-partial"),
        ({"kind": "zone-partial", "members": [], "samples": 0}, "1 to"),
        (
            {
                "kind": "zone-partial",
                "samples": 3,
                "members": [
                    {"task_id": "t", "node_id": "n", "update_hash": "h", "samples": 2},
                    {"task_id": "u", "node_id": "n", "update_hash": "h", "samples": 2},
                ],
            },
            "members' sum",
        ),
        (
            {
                "kind": "zone-partial",
                "samples": 4,
                "members": [
                    {"task_id": "t", "node_id": "n", "update_hash": "h", "samples": 2},
                    {"task_id": "t", "node_id": "m", "update_hash": "h", "samples": 2},
                ],
            },
            "twice",
        ),
        (
            {
                "kind": "zone-partial",
                "samples": 1,
                "members": [{"task_id": "t", "node_id": "n", "update_hash": "h", "samples": True}],
            },
            "whole number",
        ),
    ],
)
def test_bad_manifests_are_refused(manifest: dict, why: str) -> None:
    with pytest.raises(UpdateRejected, match=why):
        decode_partial(_with_manifest(_state(1), manifest), _state(1), 1e4)


def test_partial_must_match_the_model() -> None:
    manifest = {"kind": "zone-partial", "samples": 1, "members": [
        {"task_id": "t", "node_id": "n", "update_hash": "h", "samples": 1}]}  # fmt: skip
    wrong = {"w": torch.zeros(8, 5)}
    with pytest.raises(UpdateRejected):
        decode_partial(_with_manifest(wrong, manifest), _state(1), 1e4)
    nan = _state(1)
    nan["b"][0] = float("nan")
    with pytest.raises(UpdateRejected) as exc:
        decode_partial(_with_manifest(nan, manifest), _state(1), 1e4)
    assert exc.value.reason == "non_finite"


def test_member_token() -> None:
    key = round_key("server-secret", 41, "agg-1")
    token = member_token(key, "task-7", "node-3", 120)
    assert token_ok(key, token, "task-7", "node-3", 120)
    # another task, node, weight, round or aggregator: refused
    assert not token_ok(key, token, "task-8", "node-3", 120)
    assert not token_ok(key, token, "task-7", "node-4", 120)
    assert not token_ok(key, token, "task-7", "node-3", 121)
    assert not token_ok(round_key("server-secret", 42, "agg-1"), token, "task-7", "node-3", 120)
    assert not token_ok(round_key("server-secret", 41, "agg-2"), token, "task-7", "node-3", 120)
    assert not token_ok(round_key("other-secret", 41, "agg-1"), token, "task-7", "node-3", 120)
    assert not token_ok(key, "", "task-7", "node-3", 120)


@pytest.mark.parametrize("strategy", ["trimmed_mean", "median", "krum"])
def test_spec_refuses_rules_that_need_single_updates(strategy: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({"name": "x", "aggregation": {"strategy": strategy, "hierarchy": "zones"}})
    assert "aggregation.hierarchy" in str(exc.value)
    assert "hides" in str(exc.value)


def test_spec_refuses_health_weighting_with_zones() -> None:
    with pytest.raises(SpecError, match="weighting"):
        parse_spec({"name": "x", "aggregation": {"weighting": "health", "hierarchy": "zones"}})
    spec = parse_spec({"name": "x", "aggregation": {"hierarchy": "zones"}})
    assert spec.aggregation.hierarchy == "zones"
    assert parse_spec({"name": "x"}).aggregation.hierarchy == "flat"


def test_provenance_records_the_hierarchy() -> None:
    chain = ProvenanceChain("job")
    zone = _zones(1, 2)[0]
    global_state = _state(5)
    decoded = decode_partial(_partial(zone, 0), global_state, 1e4)
    members = tuple(m.to_dict() for m in decoded.members)
    update = ClientUpdate("zone:z0:agg", decoded.mean, decoded.samples, {}, members)
    strategy = build_strategy(AggregationSpec())
    before = {k: v.clone() for k, v in strategy.state_dict().items()}
    new = strategy.aggregate(global_state, [update])
    record = record_round(
        chain, None, round=1, global_state=global_state, strategy=strategy,
        strategy_state_before=before, updates=[(update, "shards")], new_state=new,
        metrics={"accuracy": 0.5},
    )  # fmt: skip
    assert record.contributions[0].members == members
    assert record.contributions[0].update_hash == state_hash(decoded.mean)
    again = ProvenanceChain.from_json(chain.to_json())
    assert again.records[0].contributions[0].to_dict()["members"][1]["task_id"] == "t0-1"
    # a flat contribution's body has no members key: old chains hash as they did
    flat = Contribution("n", "s", "h", 3)
    assert "members" not in flat.to_dict()
