from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer.checkpoint import (
    FORMAT,
    Checkpoint,
    CheckpointError,
    checkpoint_info,
    load_checkpoint,
    save_checkpoint,
)
from trainer.hashing import state_hash
from trainer.spec import JobSpec


def _ckpt() -> Checkpoint:
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(8, 4, generator=g)
    return Checkpoint(
        spec=JobSpec(name="ckpt-test", seed=5).to_dict(),
        round=12,
        model_state={
            "enc.weight": weight,
            "dec.weight": weight,  # tied weights share memory
            "enc.bias": torch.randn(8, generator=g).to(torch.float16),
            "bn.num_batches_tracked": torch.tensor(40),
        },
        strategy_state={
            "m/enc.weight": torch.randn(8, 4, generator=g, dtype=torch.float64),
            "v/enc.weight": torch.rand(4, 8, generator=g).t(),  # non-contiguous
            "step": torch.tensor(12, dtype=torch.int64),
        },
        history=[{"round": i, "loss": 1.0 / (i + 1), "accuracy": 0.1 * i} for i in range(12)],
        rng={"sim_seed": 123, "node_seeds": [1, 2, 3], "torch_state": "base64..."},
        extra={"note": "résumé", "nan_loss": math.nan},
    )


def _assert_states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_round_trip_is_exact(tmp_path: Path) -> None:
    original = _ckpt()
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, original)
    loaded = load_checkpoint(path)
    _assert_states_equal(loaded.model_state, original.model_state)
    _assert_states_equal(loaded.strategy_state, original.strategy_state)
    assert loaded.spec == original.spec
    assert JobSpec.model_validate(loaded.spec).name == "ckpt-test"
    assert loaded.round == 12
    assert loaded.history == original.history
    assert loaded.rng == original.rng
    assert loaded.extra["note"] == "résumé" and math.isnan(loaded.extra["nan_loss"])


def test_single_file_with_prefixed_tensors_and_metadata(tmp_path: Path) -> None:
    original = _ckpt()
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, original)
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind
    names = set(load_file(str(path)))
    assert "model/enc.weight" in names and "strategy/step" in names
    info = checkpoint_info(path)
    assert info["format"] == FORMAT
    assert info["model_hash"] == state_hash(original.model_state)
    assert info["round"] == 12
    assert info["created_at"].endswith("+00:00")


def test_empty_strategy_state(tmp_path: Path) -> None:
    ckpt = Checkpoint(spec={}, round=0, model_state={"w": torch.ones(2)}, strategy_state={})
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, ckpt)
    loaded = load_checkpoint(path)
    assert loaded.strategy_state == {}
    assert loaded.history == [] and loaded.rng == {} and loaded.extra == {}


def test_overwrite_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    newer = _ckpt()
    newer.round = 13
    save_checkpoint(path, newer)
    assert load_checkpoint(path).round == 13
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_failed_save_leaves_previous_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    before = path.read_bytes()
    bad = _ckpt()
    bad.extra = {"not_json": object()}
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(path, bad)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 17])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)


def test_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    path.write_bytes(b"\x80\x04not a checkpoint at all" * 3)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(path)


def test_foreign_safetensors_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"weight": torch.ones(3)}, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="not a GPUFlex checkpoint"):
        load_checkpoint(path)


def _rewrite(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def _meta(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata())


def test_tampered_model_weights(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    tensors, meta = load_file(str(path)), _meta(path)
    tensors["model/enc.bias"] = tensors["model/enc.bias"] * 2
    _rewrite(path, tensors, meta)
    with pytest.raises(CheckpointError, match="model hash mismatch"):
        load_checkpoint(path)


def test_tampered_strategy_state(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    tensors, meta = load_file(str(path)), _meta(path)
    tensors["strategy/step"] = torch.tensor(99)
    _rewrite(path, tensors, meta)
    with pytest.raises(CheckpointError, match="strategy state hash mismatch"):
        load_checkpoint(path)


def test_unexpected_tensor_and_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, _ckpt())
    tensors, meta = load_file(str(path)), _meta(path)
    _rewrite(path, tensors | {"optimizer/x": torch.ones(1)}, meta)
    with pytest.raises(CheckpointError, match="unexpected tensor 'optimizer/x'"):
        load_checkpoint(path)
    _rewrite(path, tensors, meta | {"json": "{not json"})
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)
    doc = json.loads(meta["json"])
    del doc["round"]
    _rewrite(path, tensors, meta | {"json": json.dumps(doc)})
    with pytest.raises(CheckpointError, match="'round'"):
        load_checkpoint(path)


def test_invalid_round_is_refused_on_save(tmp_path: Path) -> None:
    ckpt = _ckpt()
    ckpt.round = -1
    with pytest.raises(CheckpointError, match="round"):
        save_checkpoint(tmp_path / "c.safetensors", ckpt)
