"""The agent's secure-aggregation arithmetic (trainer/secagg/packed.py: packed Python integers,
no numpy) against the numpy path the server and the simulator use (field.py, vectors.py):
the same field elements and the same masked upload, on random vectors (#32)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from trainer.secagg import field as gf
from trainer.secagg import packed
from trainer.secagg.protocol import Participant, Roster, threshold_for, unmask_sum
from trainer.secagg.vectors import decode_masked, encode_masked, flatten
from trainer.updates import encode_state

CLIP = 1.5


def _as_np(v: packed.Packed) -> np.ndarray:
    return np.array(packed.elements(v), dtype=np.int64)


def _random_field(rng: np.random.Generator, n: int) -> np.ndarray:
    # the edges of the field too: 0, 1, p - 1, and values either side of p/2
    edges = np.array([0, 1, gf.PRIME - 1, gf.PRIME - 2, gf.HALF, gf.HALF + 1], dtype=np.int64)
    return np.concatenate([edges, rng.integers(0, gf.PRIME, n, dtype=np.int64)])


@pytest.mark.parametrize("seed", range(5))
def test_add_sub_and_expand_agree_with_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = _random_field(rng, 997), _random_field(rng, 997)
    rng.shuffle(b)
    pa, pb = packed.from_elements(a.tolist(), len(a)), packed.from_elements(b.tolist(), len(b))
    assert np.array_equal(_as_np(pa), a)
    assert np.array_equal(_as_np(packed.add(pa, pb)), gf.add(a, b))
    assert np.array_equal(_as_np(packed.sub(pa, pb)), gf.sub(a, b))
    assert np.array_equal(_as_np(packed.sub(pb, pa)), gf.sub(b, a))
    key = os.urandom(32)
    assert np.array_equal(_as_np(packed.expand(key, 4099)), gf.expand(key, 4099))


def test_expand_reduces_the_largest_keystream_words() -> None:
    # words at and above p reduce by p; the lane arithmetic must agree on them too
    words = [2**64 - 1, gf.PRIME, gf.PRIME - 1, 2**32, 2**32 - 1, 5 * 2**32 + 7, 0]
    bits = int.from_bytes(b"".join(w.to_bytes(8, "little") for w in words), "little")
    assert packed.elements(packed.Packed(packed._reduce(bits, len(words)), len(words))) == [
        w % gf.PRIME for w in words
    ]


@pytest.mark.parametrize("count", [3, 7, 100])
def test_quantize_agrees_with_numpy(count: int) -> None:
    rng = np.random.default_rng(count)
    x = np.concatenate([
        rng.normal(0, 1, 3000),  # some beyond the clipping range
        [0.0, -0.0, CLIP, -CLIP, 2 * CLIP, -np.inf, np.inf, 1e-30],
        # exact halves of a quantization step: rounded to even by both
        (np.arange(-4, 5) + 0.5) / gf.scale_for(count, CLIP),
    ])  # fmt: skip
    assert np.array_equal(_as_np(packed.quantize(x.tolist(), count, CLIP)),
                          gf.quantize(x, count, CLIP))  # fmt: skip
    with pytest.raises(ValueError, match="not a number"):
        packed.quantize([0.0, float("nan")], count, CLIP)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_plain_update_flattens_as_the_numpy_path_does(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    state = {
        "b.weight": torch.randn(5, 7, generator=g).to(dtype),
        "a.bias": torch.randn(7, generator=g).to(dtype),
        "norm.num_batches_tracked": torch.tensor(12, dtype=torch.int64),
        "c": torch.randn(2, 3, 4, generator=g).to(dtype),
    }
    values, meta = packed.flatten_update(encode_state(state, {"precision": "fp32"}))
    assert np.array_equal(np.array(values), flatten(state))
    assert meta["precision"] == "fp32"


def test_a_malformed_update_is_an_error_naming_it() -> None:
    good = encode_state({"w": torch.ones(4)})
    with pytest.raises(ValueError, match="too short"):
        packed.flatten_update(b"\x01")
    with pytest.raises(ValueError, match="runs past its end"):
        packed.flatten_update((10**6).to_bytes(8, "little") + good[8:])
    with pytest.raises(ValueError, match="does not match"):
        packed.flatten_update(good[:-4])


def _header(data: bytes) -> dict:
    return json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])


def _roster_of(nodes: dict[int, Participant]) -> Roster:
    return Roster(
        b"test|job|7", threshold_for(len(nodes), 0.66),
        {i: p.c.public for i, p in nodes.items()}, {i: p.s.public for i, p in nodes.items()},
    )  # fmt: skip


def test_a_round_masked_by_packed_integers_unmasks_as_the_numpy_one() -> None:
    """Five nodes, one dropped after sharing: each survivor's masked input and upload bytes
    from the packed path equal the numpy path's, and the server's unmasked sum is exact."""
    rng = np.random.default_rng(11)
    n, drop = 5, {4}
    values = [rng.uniform(-CLIP, CLIP, 1000) for _ in range(n)]
    nodes = {i + 1: Participant() for i in range(n)}
    roster = _roster_of(nodes)
    mail = {i: p.shares(roster, i) for i, p in nodes.items()}
    for i, p in nodes.items():
        p.receive({u: mail[u][i] for u in nodes if u != i})
    masked = {}
    for i, p in nodes.items():
        if i in drop:
            continue
        by_numpy = p.mask(gf.quantize(values[i - 1], n, CLIP))
        q = packed.quantize(values[i - 1].tolist(), n, CLIP)
        by_packed = packed.mask(q, p.mask_terms())
        assert np.array_equal(_as_np(by_packed), by_numpy)
        meta = {"precision": "fp32", "secagg": "masked", "device": "cpu"}
        upload, reference = packed.encode_masked(by_packed, meta), encode_masked(by_numpy, meta)
        # safetensors orders metadata as its hash map does: the same header, not its bytes
        assert _header(upload) == _header(reference) and len(upload) == len(reference)
        assert upload[-4 * len(values[0]) :] == reference[-4 * len(values[0]) :]
        masked[i] = decode_masked(upload, len(values[0]))
    replies = {i: nodes[i].unmask(sorted(masked), sorted(drop)) for i in masked}
    total = gf.dequantize_sum(unmask_sum(roster, masked, sorted(drop), replies), n, CLIP)
    expected = np.sum([values[i - 1] for i in masked], axis=0)
    assert np.abs(total - expected).max() <= n * gf.quantization_error(n, CLIP)
