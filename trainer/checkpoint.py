"""Self-describing checkpoints: everything needed to resume a job, in one safetensors file.

Tensors are stored as ``model/<name>``, ``strategy/<name>`` and, for jobs that deliver
models as deltas, ``residual/<name>`` (what the last delta left out, trainer.delivery);
everything else (the job spec, round counter, history, RNG bookkeeping, extras) travels as
one JSON document in the safetensors metadata, next to content hashes that `load_checkpoint`
re-checks. Writes are atomic: a crash mid-save leaves the previous checkpoint intact, never a
half file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainer.artifacts import atomic_write, prepare_for_save
from trainer.digest import short
from trainer.hashing import state_hash

FORMAT = "gpuflex/checkpoint-v1"
_MODEL = "model/"
_STRATEGY = "strategy/"
_RESIDUAL = "residual/"


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged, tampered with or not a GPUFlex checkpoint."""


@dataclass
class Checkpoint:
    spec: dict[str, Any]  # JobSpec.to_dict()
    round: int  # rounds completed
    model_state: dict[str, torch.Tensor]
    strategy_state: dict[str, torch.Tensor] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # per-round metrics
    rng: dict[str, Any] = field(default_factory=dict)  # JSON-able RNG/bookkeeping state
    extra: dict[str, Any] = field(default_factory=dict)  # JSON-able
    # the delivery residual carried into the next round (trainer.delivery); empty without
    residual: dict[str, torch.Tensor] = field(default_factory=dict)


def _json_part(ckpt: Checkpoint) -> str:
    doc = {
        "spec": ckpt.spec,
        "round": ckpt.round,
        "history": ckpt.history,
        "rng": ckpt.rng,
        "extra": ckpt.extra,
    }
    try:
        return json.dumps(doc, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint fields are not JSON-serialisable: {exc}") from None


def save_checkpoint(path: Path | str, ckpt: Checkpoint) -> None:
    path = Path(path)
    if isinstance(ckpt.round, bool) or not isinstance(ckpt.round, int) or ckpt.round < 0:
        raise CheckpointError(f"checkpoint round must be a non-negative int, got {ckpt.round!r}")
    model = prepare_for_save(ckpt.model_state)
    strategy = prepare_for_save(ckpt.strategy_state)
    tensors = {_MODEL + k: v for k, v in model.items()}
    tensors |= {_STRATEGY + k: v for k, v in strategy.items()}
    residual = prepare_for_save(ckpt.residual)
    tensors |= {_RESIDUAL + k: v for k, v in residual.items()}
    metadata = {
        "format": FORMAT,
        "json": _json_part(ckpt),
        "model_hash": state_hash(model),
        # not required by the format, but strategy state is as much a part of resuming
        "strategy_hash": state_hash(strategy),
        "residual_hash": state_hash(residual),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _read_metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except Exception as exc:  # safetensors raises several types for a damaged header
        raise CheckpointError(
            f"{path} is not a readable safetensors file (corrupt or truncated?): "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:
        raise CheckpointError(
            f"{path}: tensor data is unreadable (corrupt or truncated?): "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _split(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    parts: dict[str, dict[str, torch.Tensor]] = {_MODEL: {}, _STRATEGY: {}, _RESIDUAL: {}}
    for name, tensor in tensors.items():
        prefix = next((p for p in parts if name.startswith(p)), None)
        if prefix is None:
            raise CheckpointError(
                f"{path}: unexpected tensor '{name}' (not model/, strategy/ or residual/)"
            )
        parts[prefix][name.removeprefix(prefix)] = tensor
    return parts


def _check_hash(
    path: Path, what: str, recorded: str | None, state: dict[str, torch.Tensor]
) -> None:
    if recorded is None:
        return
    actual = state_hash(state)
    if actual != recorded:
        raise CheckpointError(
            f"{path}: {what} hash mismatch: recorded {short(recorded)}, "
            f"content hashes to {short(actual)} (file modified or damaged)"
        )


def _parse_json(path: Path, text: str | None) -> dict[str, Any]:
    if text is None:
        raise CheckpointError(f"{path}: checkpoint metadata has no 'json' entry")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: checkpoint metadata is not valid JSON: {exc}") from None
    expected = {"spec": dict, "round": int, "history": list, "rng": dict, "extra": dict}
    for key, kind in expected.items():
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            raise CheckpointError(
                f"{path}: checkpoint field '{key}' missing or not a {kind.__name__}"
            )
    return doc


def load_checkpoint(path: Path | str) -> Checkpoint:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    meta = _read_metadata(path)
    fmt = meta.get("format")
    if fmt != FORMAT:
        raise CheckpointError(
            f"{path} is not a GPUFlex checkpoint (format {fmt!r}, expected {FORMAT!r})"
        )
    if "model_hash" not in meta:
        raise CheckpointError(f"{path}: checkpoint metadata has no 'model_hash'")
    doc = _parse_json(path, meta.get("json"))
    parts = _split(path, _read_tensors(path))
    model, strategy, residual = parts[_MODEL], parts[_STRATEGY], parts[_RESIDUAL]
    _check_hash(path, "model", meta["model_hash"], model)
    _check_hash(path, "strategy state", meta.get("strategy_hash"), strategy)
    _check_hash(path, "delivery residual", meta.get("residual_hash"), residual)
    return Checkpoint(
        spec=doc["spec"],
        round=doc["round"],
        model_state=model,
        strategy_state=strategy,
        history=doc["history"],
        rng=doc["rng"],
        extra=doc["extra"],
        residual=residual,
    )


def checkpoint_info(path: Path | str) -> dict[str, Any]:
    """The header of a checkpoint (format, hashes, created_at, round) without loading tensors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    meta = _read_metadata(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a GPUFlex checkpoint")
    doc = _parse_json(path, meta.get("json"))
    info: dict[str, Any] = {k: v for k, v in meta.items() if k != "json"}
    info["round"] = doc["round"]
    return info
