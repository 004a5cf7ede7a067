from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.datasets import Dataset, load_digits_dataset
from trainer.hashing import state_hash
from trainer.sharding import Shard, ShardingError, plan_shards


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits_dataset()


def _classification(labels: list[int] | np.ndarray) -> Dataset:
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    x = torch.arange(y.numel(), dtype=torch.float32)[:, None]  # row i holds the value i
    return Dataset("toy", "classification", x, y, x[:1], y[:1], int(y.max()) + 1, (1,))


def _sequences(lengths: np.ndarray, seq_len: int = 64) -> Dataset:
    n = lengths.size
    x = torch.arange(n * seq_len, dtype=torch.int64).reshape(n, seq_len) % 256
    lens = torch.as_tensor(lengths, dtype=torch.int64)
    return Dataset("seq", "language_model", x, x, x[:1], x[:1], 256, (seq_len,), lens, lens[:1])


def _assert_partition(shards: list[Shard], n: int) -> None:
    joined = np.concatenate([s.indices for s in shards])
    assert joined.size == n and np.array_equal(np.sort(joined), np.arange(n))


def _class_counts(dataset: Dataset, shard: Shard) -> np.ndarray:
    labels = dataset.y_train.numpy()[shard.indices]
    return np.bincount(labels, minlength=dataset.num_classes)


# -- stratified / random ---------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [3, 7, 8, 16])
def test_stratified_every_class_within_one_of_its_share(digits: Dataset, num_shards: int) -> None:
    shards = plan_shards(digits, num_shards, "stratified", seed=1)
    _assert_partition(shards, digits.num_train)
    totals = np.bincount(digits.y_train.numpy(), minlength=10)
    for shard in shards:
        assert np.all(np.abs(_class_counts(digits, shard) - totals / num_shards) <= 1)
    sizes = [s.size for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert [s.index for s in shards] == list(range(num_shards))


def test_random_shards_are_even_and_sorted(digits: Dataset) -> None:
    shards = plan_shards(digits, 5, "random", seed=0)
    _assert_partition(shards, digits.num_train)
    assert {s.size for s in shards} <= {287, 288}
    for s in shards:
        assert s.indices.dtype == np.int64 and np.all(np.diff(s.indices) > 0)


@pytest.mark.parametrize("method", ["random", "stratified"])
def test_same_seed_same_shards_other_seed_differs(digits: Dataset, method: str) -> None:
    a = plan_shards(digits, 4, method, seed=7)
    b = plan_shards(digits, 4, method, seed=7)
    c = plan_shards(digits, 4, method, seed=8)
    assert a == b and [s.content_hash for s in a] == [s.content_hash for s in b]
    assert a != c and a[0].content_hash != c[0].content_hash


def test_stratified_falls_back_to_random_without_classes() -> None:
    ds = _sequences(np.arange(1, 31))
    _assert_partition(plan_shards(ds, 4, "stratified"), 30)


# -- content hashes --------------------------------------------------------------------------


def test_hash_is_over_samples_not_indices(digits: Dataset) -> None:
    shard = plan_shards(digits, 3, "random", seed=0)[1]
    idx = torch.from_numpy(shard.indices)
    assert shard.content_hash == state_hash({"x": digits.x_train[idx], "y": digits.y_train[idx]})
    # The same samples at other positions (rows prepended) give the same hash ...
    shifted = Dataset(
        "shifted",
        "classification",
        torch.cat([digits.x_train[:5], digits.x_train]),
        torch.cat([digits.y_train[:5], digits.y_train]),
        digits.x_test,
        digits.y_test,
        10,
        (64,),
    )
    moved = plan_shards(shifted, 1, "prepartitioned", partitions=[(shard.indices + 5).tolist()])
    assert moved[0].content_hash == shard.content_hash
    # ... and changing one sample's value changes it.
    x = digits.x_train.clone()
    x[shard.indices[0], 0] += 0.5
    changed = Dataset("c", "classification", x, digits.y_train, x, digits.y_train, 10, (64,))
    again = plan_shards(changed, 1, "prepartitioned", partitions=[shard.indices.tolist()])
    assert again[0].content_hash != shard.content_hash


# -- capability ------------------------------------------------------------------------------


def test_capability_sizes_proportional_and_exact(digits: Dataset) -> None:
    weights = [1.0, 2.0, 3.5, 0.5]
    shards = plan_shards(digits, 4, "capability", seed=3, weights=weights)
    _assert_partition(shards, digits.num_train)
    n, total = digits.num_train, sum(weights)
    for shard, w in zip(shards, weights, strict=True):
        assert abs(shard.size - n * w / total) < 1
    # the class mix follows the size: every class within 2 of its proportional share
    totals = np.bincount(digits.y_train.numpy(), minlength=10)
    for shard in shards:
        expected = totals * shard.size / n
        assert np.all(np.abs(_class_counts(digits, shard) - expected) <= 2)


def test_capability_gives_every_shard_a_sample() -> None:
    ds = _classification([0, 1] * 10)
    shards = plan_shards(ds, 3, "capability", weights=[1000.0, 1000.0, 0.001])
    # largest remainder gives 10, 10, 0; the empty shard takes one from the first largest
    assert [s.size for s in shards] == [9, 10, 1]
    _assert_partition(shards, 20)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        (None, r"needs weights"),
        ([1.0, 2.0], r"2 weights for 3 shards"),
        ([1.0, 0.0, 2.0], r"weight 1 is 0\.0"),
        ([1.0, 1.0, -3.0], r"weight 2 is -3\.0"),
        ([1.0, float("nan"), 1.0], r"positive and finite; weight 1 is nan"),
        (["fast", "slow", "x"], r"weights must be numbers"),
    ],
)
def test_capability_weight_errors(digits: Dataset, weights: list[object] | None, match: str):
    with pytest.raises(ShardingError, match=match):
        plan_shards(digits, 3, "capability", weights=weights)  # type: ignore[arg-type]


# -- length ----------------------------------------------------------------------------------


def test_length_balances_tokens_and_length_mix() -> None:
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 8, 300), rng.integers(50, 64, 100)])
    ds = _sequences(lengths)
    for num_shards in (3, 6, 7):
        shards = plan_shards(ds, num_shards, "length", seed=2)
        _assert_partition(shards, lengths.size)
        tokens = np.array([lengths[s.indices].sum() for s in shards])
        # within one short sample, far tighter than one long sample (>= 50)
        assert tokens.max() - tokens.min() <= 7
        long_counts = [int((lengths[s.indices] >= 50).sum()) for s in shards]
        assert max(long_counts) - min(long_counts) <= 1  # every shard gets the same mix
    shards = plan_shards(ds, 6, "length", seed=2)
    assert plan_shards(ds, 6, "length", seed=2) == shards
    assert plan_shards(ds, 6, "length", seed=3) != shards  # ties broken by the seed


def test_length_equal_lengths_give_equal_counts() -> None:
    shards = plan_shards(_sequences(np.full(50, 10)), 7, "length")
    assert sorted(s.size for s in shards) == [7] * 6 + [8]


def test_length_needs_lengths(digits: Dataset) -> None:
    with pytest.raises(ShardingError, match=r"'length' needs per-sample lengths"):
        plan_shards(digits, 2, "length")


# -- prepartitioned --------------------------------------------------------------------------


def test_prepartitioned_uses_partitions_exactly() -> None:
    ds = _classification([0, 1, 2] * 4)
    parts = [[5, 0, 3], [11], [1, 2, 4, 6]]
    shards = plan_shards(ds, 3, "prepartitioned", partitions=parts, seed=0)
    assert [s.indices.tolist() for s in shards] == [sorted(p) for p in parts]
    assert plan_shards(ds, 3, "prepartitioned", partitions=parts, seed=9) == shards


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        (None, r"needs partitions"),
        ([[0], [1]], r"2 partitions for 3 shards"),
        ([[0], [1], [12]], r"partition 2 has index 12 out of range \(0\.\.11\)"),
        ([[0], [-1], [2]], r"partition 1 has index -1 out of range"),
        ([[0, 1], [2], [1]], r"index 1 is in partition 0 and partition 2"),
        ([[0], [], [2]], r"partition 1 is empty"),
        ([[0, 0], [1], [2]], r"partition 0 lists index 0 more than once"),
        ([[0.5], [1], [2]], r"partition 0 must be a flat list of integer indices"),
    ],
)
def test_prepartitioned_errors(parts: list[list[int]] | None, match: str) -> None:
    ds = _classification([0, 1, 2] * 4)
    with pytest.raises(ShardingError, match=match):
        plan_shards(ds, 3, "prepartitioned", partitions=parts)


# -- general errors --------------------------------------------------------------------------


def test_general_errors() -> None:
    ds = _classification([0, 1] * 3)
    with pytest.raises(ShardingError, match=r"num_shards must be >= 1, got 0"):
        plan_shards(ds, 0)
    with pytest.raises(ShardingError, match=r"7 shards but only 6 training samples"):
        plan_shards(ds, 7)
    with pytest.raises(ShardingError, match=r"unknown sharding method 'magic'; known: random"):
        plan_shards(ds, 2, "magic")
    with pytest.raises(ShardingError, match=r"num_shards must be an integer"):
        plan_shards(ds, 2.5)  # type: ignore[arg-type]
    assert issubclass(ShardingError, ValueError)


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    data=st.data(),
    method=st.sampled_from(["random", "stratified"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_shards_partition_the_index_set(
    labels: list[int], data: st.DataObject, method: str, seed: int
) -> None:
    ds = _classification(labels)
    num_shards = data.draw(st.integers(1, len(labels)))
    shards = plan_shards(ds, num_shards, method, seed=seed)
    assert len(shards) == num_shards and all(s.size >= 1 for s in shards)
    _assert_partition(shards, len(labels))
    sizes = [s.size for s in shards]
    assert max(sizes) - min(sizes) <= 1
