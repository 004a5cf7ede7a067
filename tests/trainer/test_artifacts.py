from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer.artifacts import ArtifactError, ArtifactStore
from trainer.hashing import bytes_hash, state_hash


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(4, 3, generator=g),
        "b": torch.randn(3, generator=g).to(torch.float64),
        "steps": torch.tensor(7, dtype=torch.int64),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
    }


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_put_get_round_trip_is_exact_and_keyed_by_state_hash(store: ArtifactStore) -> None:
    state = _state()
    key = store.put_state(state)
    assert key == state_hash(state)
    assert store.has(key)
    assert store.state_path(key) == store.root / key[:2] / f"{key}.safetensors"
    _assert_same(store.get_state(key), state)


def test_put_is_idempotent_and_leaves_no_temp_files(store: ArtifactStore) -> None:
    state = _state()
    key = store.put_state(state)
    mtime = store.state_path(key).stat().st_mtime_ns
    assert store.put_state({k: v.clone() for k, v in state.items()}) == key
    assert store.state_path(key).stat().st_mtime_ns == mtime  # not rewritten
    files = [p for p in store.root.rglob("*") if p.is_file()]
    assert files == [store.state_path(key)]


def test_shared_and_non_contiguous_tensors_are_stored(store: ArtifactStore) -> None:
    base = torch.randn(4, 6)
    state = {"a": base, "tied": base, "t": base.t(), "view": base[1:3]}
    key = store.put_state(state)
    _assert_same(store.get_state(key), state)


def test_empty_state_and_metadata(store: ArtifactStore) -> None:
    key = store.put_state({}, metadata={"kind": "strategy", "round": 3})
    assert store.get_state(key) == {}
    assert store.get_metadata(key) == {"kind": "strategy", "round": 3}


def test_missing_key_is_artifact_error_and_key_error(store: ArtifactStore) -> None:
    key = "ab" * 32
    assert not store.has(key)
    with pytest.raises(ArtifactError, match="not found") as info:
        store.get_state(key)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value).startswith("artifact abababababab")


@pytest.mark.parametrize("key", ["../../etc/passwd", "AB" * 32, "ab" * 31, ""])
def test_invalid_keys_are_rejected(store: ArtifactStore, key: str) -> None:
    with pytest.raises(ArtifactError, match="invalid artifact key"):
        store.get_state(key)


def test_swapped_content_is_detected(store: ArtifactStore) -> None:
    key_a = store.put_state(_state(0))
    key_b = store.put_state(_state(1))
    os.replace(store.state_path(key_b), store.state_path(key_a))
    with pytest.raises(ArtifactError, match="does not match its key"):
        store.get_state(key_a)


def test_silently_edited_tensor_is_detected(store: ArtifactStore) -> None:
    state = _state()
    key = store.put_state(state)
    edited = dict(state, w=state["w"] + 1e-6)
    save_file({k: v.contiguous() for k, v in edited.items()}, str(store.state_path(key)))
    with pytest.raises(ArtifactError, match="does not match its key"):
        store.get_state(key)


def test_corrupt_file_is_detected(store: ArtifactStore) -> None:
    key = store.put_state(_state())
    path = store.state_path(key)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ArtifactError, match="corrupt"):
        store.get_state(key)


def test_bytes_round_trip_and_tamper(store: ArtifactStore) -> None:
    data = b"encoded update \x00\xff" * 10
    key = store.put_bytes(data)
    assert key == bytes_hash(data)
    assert store.put_bytes(data) == key
    assert store.has_bytes(key) and not store.has(key)
    assert store.get_bytes(key) == data
    store.bytes_path(key).write_bytes(data + b"!")
    with pytest.raises(ArtifactError, match="does not match its key"):
        store.get_bytes(key)
    with pytest.raises(ArtifactError, match="not found"):
        store.get_bytes("cd" * 32)
