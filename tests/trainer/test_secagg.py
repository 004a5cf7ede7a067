"""Secure aggregation's protocol (trainer/secagg): Shamir, masks that cancel, dropout
recovery, the quantization bound, the refusals that keep inputs hidden, and that a masked
update tells nothing about the update it hides."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trainer.secagg import field as gf
from trainer.secagg import shamir
from trainer.secagg.protocol import Participant, ProtocolError, Roster, threshold_for, unmask_sum
from trainer.secagg.vectors import decode_masked, encode_masked

CLIP = 1.0


def _round(values: list[np.ndarray], drop: set[int], fraction: float = 0.66):
    """Run the protocol among len(values) nodes; `drop`: indices that stop after sharing."""
    n = len(values)
    nodes = {i + 1: Participant() for i in range(n)}
    roster = Roster(
        b"test|job|1",
        threshold_for(n, fraction),
        {i: p.c.public for i, p in nodes.items()},
        {i: p.s.public for i, p in nodes.items()},
    )
    mail = {i: p.shares(roster, i) for i, p in nodes.items()}
    for i, p in nodes.items():
        p.receive({u: mail[u][i] for u in nodes if u != i})
    masked = {
        i: p.mask(gf.quantize(values[i - 1], n, CLIP)) for i, p in nodes.items() if i not in drop
    }
    survivors = sorted(masked)
    replies = {i: nodes[i].unmask(survivors, sorted(drop)) for i in survivors}
    total = unmask_sum(roster, masked, sorted(drop), replies)
    return nodes, roster, masked, gf.dequantize_sum(total, n, CLIP)


def test_shamir_reconstructs_from_any_threshold_and_not_from_fewer() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, list(range(1, 11)), 7)
    assert shamir.combine({x: shares[x] for x in (1, 3, 4, 5, 8, 9, 10)}) == secret
    assert shamir.combine({x: shares[x] for x in range(4, 11)}) == secret
    with pytest.raises(ValueError):  # six points make a different (521-bit) polynomial value
        assert shamir.combine({x: shares[x] for x in range(1, 7)}) != secret
    assert shamir.from_bytes(shamir.to_bytes(shares[1])) == shares[1]


def test_masks_cancel_and_the_sum_is_exact_within_quantization() -> None:
    rng = np.random.default_rng(0)
    values = [rng.uniform(-CLIP, CLIP, 500) for _ in range(6)]
    _, _, _, total = _round(values, drop=set())
    bound = len(values) * gf.quantization_error(len(values), CLIP) * len(values)
    assert np.abs(total - np.sum(values, axis=0)).max() <= bound


@pytest.mark.parametrize("drop", [{2}, {1, 5}, {3, 6}])
def test_a_round_survives_nodes_that_drop_after_sharing(drop: set[int]) -> None:
    rng = np.random.default_rng(1)
    values = [rng.uniform(-CLIP, CLIP, 300) for _ in range(7)]  # 2 of 7: 28 % dropped
    _, _, masked, total = _round(values, drop=drop)
    expected = sum(values[i - 1] for i in masked)
    assert np.abs(total - expected).max() <= 7 * gf.quantization_error(7, CLIP) * 7


def test_quantization_error_is_bounded() -> None:
    rng = np.random.default_rng(2)
    for count in (2, 8, 100):
        x = rng.uniform(-CLIP, CLIP, 10_000)
        back = gf.dequantize_sum(gf.quantize(x, count, CLIP), count, CLIP)
        assert np.abs(back - x).max() <= gf.quantization_error(count, CLIP) + 1e-12
    # a sum of `count` extreme values does not wrap around the field
    x = np.full(10, CLIP)
    total = gf.quantize(x, 100, CLIP)
    for _ in range(99):
        total = gf.add(total, gf.quantize(x, 100, CLIP))
    assert np.allclose(gf.dequantize_sum(total, 100, CLIP), 100 * CLIP, rtol=1e-6)


def test_a_masked_update_does_not_correlate_with_the_update() -> None:
    """10,000 weights: a correlation this small is what independent uniform values give
    (standard error 0.01); a plain or merely quantized update correlates at 1."""
    rng = np.random.default_rng(3)
    values = [rng.normal(0, 0.3, 10_000) for _ in range(4)]
    _, _, masked, _ = _round(values, drop=set())
    for i, y in masked.items():
        signed = np.where(y > gf.HALF, y - gf.PRIME, y).astype(np.float64)
        assert abs(np.corrcoef(signed, values[i - 1])[0, 1]) < 0.05
        # the same statistic catches an unmasked (merely quantized) update: the test can fail
        q = gf.quantize(values[i - 1], 4, CLIP)
        plain = np.where(q > gf.HALF, q - gf.PRIME, q).astype(np.float64)
        assert np.corrcoef(plain, values[i - 1])[0, 1] > 0.99


def test_a_node_refuses_requests_that_would_expose_an_input() -> None:
    values = [np.zeros(10) for _ in range(5)]
    nodes = {i + 1: Participant() for i in range(5)}
    roster = Roster(b"c", 3, {i: p.c.public for i, p in nodes.items()},
                    {i: p.s.public for i, p in nodes.items()})  # fmt: skip
    mail = {i: p.shares(roster, i) for i, p in nodes.items()}
    for i, p in nodes.items():
        p.receive({u: mail[u][i] for u in nodes if u != i})
        p.mask(gf.quantize(values[i - 1], 5, CLIP))
    with pytest.raises(ProtocolError):  # node 2 named both survivor and dropped
        nodes[1].unmask([1, 2, 3, 4], [2, 5])
    with pytest.raises(ProtocolError):  # too few survivors for the threshold
        nodes[1].unmask([1, 2], [3, 4, 5])
    nodes[1].unmask([1, 2, 3, 4], [5])
    with pytest.raises(ProtocolError):  # a second request (to learn node 4's other secret)
        nodes[1].unmask([1, 2, 3, 5], [4])
    with pytest.raises(ProtocolError):  # a threshold at or below half the roster
        Participant().shares(Roster(b"c", 2, {1: b"", 2: b"", 3: b"", 4: b""},
                                    {1: b"", 2: b"", 3: b"", 4: b""}), 1)  # fmt: skip
    with pytest.raises(ValueError):  # a share sealed for node 2 does not open at node 3
        nodes[3].receive({1: mail[1][2]})


def test_masked_updates_travel_as_uint32_safetensors() -> None:
    y = np.array([0, 1, gf.PRIME - 1], dtype=np.int64)
    data = encode_masked(y, {"round": "1"})
    assert np.array_equal(decode_masked(data, 3), y)
    with pytest.raises(ValueError, match="uint32"):
        decode_masked(data, 4)
    with pytest.raises(ValueError, match="outside the field"):
        decode_masked(encode_masked(np.array([gf.PRIME], dtype=np.int64), {}), 1)
    with pytest.raises(ValueError, match="safetensors"):
        decode_masked(b"\x80\x04pickle", 1)


def test_the_simulator_aggregates_the_unmasked_mean() -> None:
    """A simulated job under secure aggregation lands where the plain one does: near-equal
    shards, so FedAvg's sample weights barely differ from the masked sum's equal ones."""
    from trainer.sim.federated import RunOptions, run_federated
    from trainer.sim.setup import prepare
    from trainer.spec import parse_spec

    base = {"name": "s", "dataset": {"kind": "digits", "test_fraction": 0.2},
            "model": {"arch": "mlp", "hidden": [16]}, "local": {"steps": 3, "batch_size": 32},
            "rounds": {"max_rounds": 2},
            "sharding": {"method": "random", "num_shards": 4}}  # fmt: skip
    finals = []
    for privacy in ({}, {"secure_aggregation": {"enabled": True}}):
        setup = prepare(parse_spec(base | {"privacy": privacy}), 4, "lan", seed=0)
        result, _ = run_federated(setup, RunOptions(stop_at_target=False))
        finals.append(result)
    assert abs(finals[0].final_accuracy - finals[1].final_accuracy) <= 0.02
