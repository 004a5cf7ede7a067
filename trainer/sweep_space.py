"""A `kind: sweep` job's `sweep:` section: the search space, the trial budget, the objective.

Each trial is an ordinary training job whose spec is the sweep's own (its training sections)
with the trial's parameters written into it (`apply_params`). trainer.sweep drives the search
(Optuna); this module only describes it, so that trainer.spec can validate it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Short names for the parameters a sweep usually searches; any of the full paths in
# PARAM_PATHS may be used as well.
ALIASES = {
    "lr": "optimizer.lr",
    "momentum": "optimizer.momentum",
    "weight_decay": "optimizer.weight_decay",
    "optimizer": "optimizer.name",
    "batch_size": "local.batch_size",
    "local_steps": "local.steps",
    "epochs": "local.epochs",
    "hidden": "model.hidden",
    "width": "model.width",  # every hidden layer of the base model this wide
    "dropout": "model.dropout",
    "server_lr": "aggregation.server_lr",
}
PARAM_PATHS = frozenset(ALIASES.values()) | {
    "model.channels",
    "model.d_model",
    "model.n_layers",
    "aggregation.mu",
}

Scalar = int | float | str | bool
Choice = Scalar | Annotated[list[Annotated[int, Field(ge=1, le=65536)]], Field(max_length=64)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamRange(_Strict):
    """A numeric range: integers when both ends are integers, else floats."""

    low: int | float
    high: int | float
    log: bool = False
    step: Annotated[float, Field(gt=0.0)] | None = None

    @model_validator(mode="after")
    def _order(self) -> ParamRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("give 'log' or 'step', not both")
        return self

    @property
    def integer(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)


Param = ParamRange | Annotated[list[Choice], Field(min_length=1, max_length=64)]


class SweepSpec(_Strict):
    # how many trials (child training jobs) the sweep runs in all
    trials: Annotated[int, Field(ge=1, le=1000)] = 16
    # how many of them train at once
    parallel: Annotated[int, Field(ge=1, le=64)] = 2
    # rounds_to_target: fewest rounds to reach `target` accuracy (a trial that never does
    # counts as max_rounds + 1); accuracy / loss: the held-out metric after the last round
    objective: Literal["rounds_to_target", "accuracy", "loss"] = "rounds_to_target"
    target: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    space: Annotated[dict[str, Param], Field(min_length=1, max_length=16)]
    sampler: Literal["tpe", "random"] = "tpe"
    pruner: Literal["median", "none"] = "median"
    # trials sampled at random before TPE models the others, and that finish before the
    # pruner compares anyone against their median
    startup_trials: Annotated[int, Field(ge=1, le=1000)] = 4
    # rounds every trial runs before it may be pruned
    warmup_rounds: Annotated[int, Field(ge=0, le=100_000)] = 1

    @field_validator("space")
    @classmethod
    def _known_paths(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if ALIASES.get(name, name) not in PARAM_PATHS:
                known = ", ".join(sorted(set(ALIASES) | PARAM_PATHS))
                raise ValueError(f"{name!r} is not a parameter a sweep can search; one of {known}")
        paths = [ALIASES.get(n, n) for n in value]
        if len(set(paths)) != len(paths):
            raise ValueError("a parameter is named twice (once by its short name)")
        if "model.width" in paths and "model.hidden" in paths:
            raise ValueError("search 'width' or 'hidden', not both")
        return value

    @model_validator(mode="after")
    def _target(self) -> SweepSpec:
        if self.target is not None and self.objective != "rounds_to_target":
            raise ValueError("'target' is for objective rounds_to_target")
        return self

    @property
    def direction(self) -> str:
        return "maximize" if self.objective == "accuracy" else "minimize"


def encode_choice(value: Any) -> Scalar:
    """Optuna's categorical choices are scalars: a list (a layer list) travels as its JSON."""
    return json.dumps(value) if isinstance(value, list) else value


def decode_choice(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("["):
        return json.loads(value)
    return value


def apply_params(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The spec mapping `base` with each parameter (by short name or path) written in."""
    data = json.loads(json.dumps(base))
    for name, raw in params.items():
        path = ALIASES.get(name, name)
        value = decode_choice(raw)
        section, _, field = path.partition(".")
        part = data.setdefault(section, {})
        if path == "model.width":
            layers = part.get("hidden") or [128]
            part["hidden"] = [int(value)] * len(layers)
            continue
        part[field] = value
        # steps and epochs are one choice: setting one clears the other
        if path == "local.steps":
            part["epochs"] = None
        elif path == "local.epochs":
            part["steps"] = None
    return data


def corner_params(space: dict[str, Param]) -> list[tuple[str, dict[str, Any]]]:
    """Each parameter at each end of its range (each of its choices) with the rest of the
    base spec as it is: the settings validation tries, so that a bad one is refused at
    submission and named by its parameter."""
    out = []
    for name, param in space.items():
        values = [param.low, param.high] if isinstance(param, ParamRange) else list(param)
        out.extend((name, {name: encode_choice(v)}) for v in values)
    return out
