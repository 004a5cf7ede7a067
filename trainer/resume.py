"""A local training run paused between two steps, and resumed later exactly where it stopped.

When the owner's computer needs its GPU (a game starts, the owner pauses), the agent asks the
task to stop; `train_local` then raises `TrainingPaused` at the next step boundary with
everything the rest of the run depends on: the weights and buffers, the optimizer's and the
loss scaler's state, the dropout RNG, the summed loss and the steps done. The batch schedule
is not stored: it is a function of the seed. Resumed from this state, a run ends with the
same update, bit for bit on the same device, as one that was never paused
(tests/trainer/test_resume.py), so a paused task loses no work and no determinism: replicas
and verification still compare it with other nodes' runs.

The state travels as one safetensors file (tensors, plus JSON in its metadata): it never
leaves the task's folder, and reading it runs no code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load, save

FORMAT = "gpuflex/paused-task-v1"
_MODEL, _OPT = "model/", "opt/"


class ResumeError(ValueError):
    """A paused state that is damaged or belongs to another run."""


@dataclass
class PausedState:
    step: int  # steps done; the run goes on from this one
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        meta = {"format": FORMAT, "step": self.step, **self.meta}
        return save(self.tensors, metadata={"gpuflex": json.dumps(meta)})

    @classmethod
    def from_bytes(cls, data: bytes) -> PausedState:
        try:
            tensors = load(data)
            # safetensors reads metadata from files only; the header of bytes is plain JSON
            size = int.from_bytes(data[:8], "little")
            meta = json.loads(json.loads(data[8 : 8 + size])["__metadata__"]["gpuflex"])
        except Exception as exc:  # safetensors raises its own errors as well as plain ones
            raise ResumeError(f"the paused state cannot be read: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ResumeError("not a GPUFlex paused-task state")
        step = meta.pop("step", None)
        meta.pop("format")
        if not isinstance(step, int) or step < 0:
            raise ResumeError("the paused state has no step count")
        return cls(step, tensors, meta)


class TrainingPaused(Exception):
    """Raised by train_local between two steps when its `pause` callable says so."""

    def __init__(self, state: PausedState) -> None:
        super().__init__(f"paused after {state.step} steps")
        self.state = state


def capture(
    step: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    loss_total: torch.Tensor,
    identity: dict[str, Any],
) -> PausedState:
    """Everything the remaining steps depend on, copied to the CPU."""
    tensors = {_MODEL + k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    opt_state = opt.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for idx, state in opt_state["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{_OPT}{idx}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    tensors["loss_total"] = loss_total.detach().cpu().reshape(1)
    tensors["rng/cpu"] = torch.get_rng_state()
    device = loss_total.device
    if device.type == "cuda":
        tensors["rng/cuda"] = torch.cuda.get_rng_state(device)
    meta = {
        "identity": identity,
        "param_groups": opt_state["param_groups"],
        "opt_scalars": scalars,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    return PausedState(step, tensors, meta)


def restore(
    state: PausedState,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    identity: dict[str, Any],
) -> torch.Tensor:
    """Put `state` back into a freshly built run; returns the summed loss so far. The run must
    be the same one (`identity`: seed, steps, batch, precision...), or ResumeError."""
    if state.meta.get("identity") != identity:
        raise ResumeError(
            f"the paused state is from another run ({state.meta.get('identity')}, "
            f"this one is {identity})"
        )
    device = next(model.parameters()).device
    weights = {k[len(_MODEL) :]: v for k, v in state.tensors.items() if k.startswith(_MODEL)}
    try:
        model.load_state_dict(weights)
        per_param: dict[int, dict[str, Any]] = {}
        for key, value in state.tensors.items():
            if key.startswith(_OPT):
                idx, name = key[len(_OPT) :].split("/", 1)
                per_param.setdefault(int(idx), {})[name] = value
        for idx, scalars in (state.meta.get("opt_scalars") or {}).items():
            per_param.setdefault(int(idx), {}).update(scalars)
        opt.load_state_dict({"state": per_param, "param_groups": state.meta["param_groups"]})
        if scaler is not None and state.meta.get("scaler"):
            scaler.load_state_dict(state.meta["scaler"])
        torch.set_rng_state(state.tensors["rng/cpu"])
        if device.type == "cuda" and "rng/cuda" in state.tensors:
            torch.cuda.set_rng_state(state.tensors["rng/cuda"], device)
        return state.tensors["loss_total"].reshape(()).to(device)
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise ResumeError(f"the paused state does not fit this model: {exc}") from None
