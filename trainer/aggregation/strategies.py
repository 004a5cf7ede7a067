"""Server-side strategies: how one round's client updates become the next global model.

In the style of Flower strategies, each is a small class over the pure functions in
`trainer.aggregation.functions`. A strategy turns the clients' deltas (local - global) into
one aggregated delta (`_combine`), then applies it to the global model (`_apply`), the only
place server optimizer state lives. Optimizer state is tensors only, so a coordinator can
checkpoint it as safetensors and a resumed run reproduces the same models bit for bit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from trainer.aggregation.functions import (
    coordinate_median,
    krum_min_updates,
    multi_krum,
    trimmed_mean,
    weighted_mean,
)
from trainer.spec import AggregationSpec
from trainer.updates import apply_delta

StateDict = dict[str, Tensor]


@dataclass(frozen=True, eq=False)
class ClientUpdate:
    """One node's contribution to a round.

    eq=False: equality and hashing are by identity, since comparing tensor fields with ==
    is ambiguous and dict fields are unhashable.
    """

    node_id: str
    delta: Mapping[str, Tensor]  # local - global
    num_samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    # a zone's pre-aggregated update (trainer.zones): the members it combined, as the
    # manifest's dicts (task_id, node_id, update_hash, samples, metrics), for provenance
    members: tuple[Mapping[str, object], ...] = ()


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


def _unit_interval(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def _check_against_global(
    aggregate: Mapping[str, Tensor], global_state: Mapping[str, Tensor]
) -> None:
    """Deltas must describe the global model: same names and shapes, floating global."""
    if aggregate.keys() != global_state.keys():
        missing = sorted(set(global_state) - set(aggregate))
        extra = sorted(set(aggregate) - set(global_state))
        raise ValueError(
            f"updates do not match the global model (missing {missing}, unexpected {extra})"
        )
    for name, g in global_state.items():
        if not g.is_floating_point():
            raise TypeError(f"global tensor '{name}' has non-floating dtype {g.dtype}")
        if aggregate[name].shape != g.shape:
            raise ValueError(
                f"updates for '{name}' have shape {list(aggregate[name].shape)}, the global "
                f"model has {list(g.shape)}"
            )


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Optimizer state precision: at least float32, as torch optimizers keep it for fp32."""
    return torch.promote_types(dtype, torch.float32)


class Strategy(ABC):
    """Aggregates client deltas into a new global model.

    Subclasses implement `_combine` (robust or weighted averaging of deltas) and, when they
    keep server optimizer state, `_apply`, `state_dict` and `load_state_dict`.
    """

    name: ClassVar[str] = "strategy"
    # FedProx: the node-side local trainer adds (mu/2)||w - w_global||^2 to its loss
    proximal_mu: float = 0.0

    def __init__(self, server_lr: float = 1.0) -> None:
        self.server_lr = _positive("server_lr", server_lr)

    def aggregate(
        self, global_state: Mapping[str, Tensor], updates: Iterable[ClientUpdate]
    ) -> StateDict:
        """The new global state after this round's updates. Inputs are not modified.

        Updates may carry only part of the model (a LoRA job's adapters, trainer.lora): the
        strategy then aggregates and steps that part, and the rest stays as it was."""
        combined = self._combine(updates)
        part = global_state
        if combined.keys() < global_state.keys():
            part = {k: global_state[k] for k in global_state if k in combined}
        _check_against_global(combined, part)
        stepped = self._apply(part, combined)
        return stepped if part is global_state else {**global_state, **stepped}

    @abstractmethod
    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        """One aggregated delta (float64) from the round's updates."""

    def _apply(self, global_state: Mapping[str, Tensor], combined: StateDict) -> StateDict:
        """Plain server step: global + server_lr * aggregated delta."""
        return apply_delta(global_state, combined, scale=self.server_lr)

    def state_dict(self) -> StateDict:
        """Server optimizer state (tensors only); empty for stateless strategies."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore `state_dict()` output; a stateless strategy accepts only an empty one."""
        if state:
            raise ValueError(f"{self.name} keeps no state, got keys {sorted(state)[:5]}")

    def params(self) -> dict[str, float | int | str]:
        """Hyper-parameters, for provenance records."""
        return {"strategy": self.name, "server_lr": self.server_lr}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "strategy")
        return f"{type(self).__name__}({args})"


def _weighted(updates: Iterable[ClientUpdate]) -> Iterator[tuple[Mapping[str, Tensor], float]]:
    """(delta, num_samples) pairs, lazily, so FedAvg streams whatever the number of nodes."""
    for update in updates:
        n = update.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(
                f"update from node '{update.node_id}' has num_samples={n!r}; it must be an "
                "int > 0 to weight the average"
            )
        yield update.delta, float(n)


class FedAvg(Strategy):
    """FedAvg (McMahan et al. 2017): global + server_lr * sample-weighted mean of deltas.

    Streams: `updates` may be a one-shot iterator of any length.
    """

    name: ClassVar[str] = "fedavg"

    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        return weighted_mean(_weighted(updates), dtype=torch.float64)


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): aggregates like FedAvg; nodes add the proximal term."""

    name: ClassVar[str] = "fedprox"

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        mu = float(mu)
        if not (math.isfinite(mu) and mu >= 0):
            raise ValueError(f"mu must be a finite number >= 0, got {mu}")
        self.proximal_mu = mu

    def params(self) -> dict[str, float | int | str]:
        return {**super().params(), "mu": self.proximal_mu}


class _Stateful(Strategy):
    """A sample-weighted mean (streamed, as in FedAvg) followed by a server optimizer with
    per-tensor state slots.

    State keys are ``"<slot>.<tensor name>"`` plus ``"step"`` (an int64 scalar: rounds
    applied). Slots are created on the first round in the global model's shape, in at least
    float32, on its device.
    """

    slots: ClassVar[tuple[str, ...]] = ()

    def __init__(self, server_lr: float) -> None:
        super().__init__(server_lr)
        self._state: dict[str, StateDict] = {slot: {} for slot in self.slots}
        self._step = 0

    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        return weighted_mean(_weighted(updates), dtype=torch.float64)

    def state_dict(self) -> StateDict:
        if self._step == 0:
            return {}
        out: StateDict = {"step": torch.tensor(self._step, dtype=torch.int64)}
        for slot, tensors in self._state.items():
            out.update({f"{slot}.{name}": t.detach().clone() for name, t in tensors.items()})
        return out

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if not state:
            self._state = {slot: {} for slot in self.slots}
            self._step = 0
            return
        step = state.get("step")
        if not isinstance(step, Tensor) or step.numel() != 1 or step.is_floating_point():
            raise ValueError(f"{self.name} state needs an integer scalar 'step' tensor")
        loaded: dict[str, StateDict] = {slot: {} for slot in self.slots}
        for key, tensor in state.items():
            if key == "step":
                continue
            slot, _, name = key.partition(".")
            if slot not in loaded or not name:
                raise ValueError(f"{self.name} state has unexpected key '{key}'")
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                raise ValueError(f"{self.name} state '{key}' must be a floating tensor")
            loaded[slot][name] = tensor.detach().clone()
        names = [set(tensors) for tensors in loaded.values()]
        if any(n != names[0] for n in names) or not names[0]:
            raise ValueError(f"{self.name} state slots {self.slots} cover different tensors")
        self._state = loaded
        self._step = int(step)

    def _slots_for(self, global_state: Mapping[str, Tensor]) -> dict[str, StateDict]:
        """State slots matching `global_state`, created (zeros) on the first round."""
        if self._step == 0:
            self._state = {
                slot: {
                    name: torch.zeros(g.shape, dtype=_state_dtype(g.dtype), device=g.device)
                    for name, g in global_state.items()
                }
                for slot in self.slots
            }
            return self._state
        for slot, tensors in self._state.items():
            if tensors.keys() != global_state.keys():
                raise ValueError(
                    f"{self.name} state '{slot}' covers {sorted(tensors)[:5]}…, not the "
                    "global model's tensors"
                )
            for name, g in global_state.items():
                t = tensors[name]
                if t.shape != g.shape:
                    raise ValueError(
                        f"{self.name} state '{slot}.{name}' has shape {list(t.shape)}, the "
                        f"global model has {list(g.shape)}"
                    )
                tensors[name] = t.to(device=g.device, dtype=_state_dtype(g.dtype))
        return self._state


class FedAdam(_Stateful):
    """FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2).

    With Δ the sample-weighted mean delta, per coordinate:
        m = beta1 m + (1 - beta1) Δ
        v = beta2 v + (1 - beta2) Δ²
        x = x + server_lr * m / (sqrt(v) + tau)
    m and v start at zero; as in the paper there is no bias correction, and tau (not an
    epsilon) sets how adaptive the step is.
    """

    name: ClassVar[str] = "fedadam"
    slots: ClassVar[tuple[str, ...]] = ("m", "v")

    def __init__(
        self,
        server_lr: float = 1.0,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
    ) -> None:
        super().__init__(server_lr)
        self.beta1 = _unit_interval("beta1", beta1)
        self.beta2 = _unit_interval("beta2", beta2)
        self.tau = _positive("tau", tau)

    def _apply(self, global_state: Mapping[str, Tensor], combined: StateDict) -> StateDict:
        slots = self._slots_for(global_state)
        step: StateDict = {}
        for name in global_state:
            m, v = slots["m"][name], slots["v"][name]
            d = combined[name].to(device=m.device, dtype=m.dtype)
            m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
            v.mul_(self.beta2).addcmul_(d, d, value=1 - self.beta2)
            step[name] = m / (v.sqrt() + self.tau)
        self._step += 1
        return apply_delta(global_state, step, scale=self.server_lr)

    def params(self) -> dict[str, float | int | str]:
        return {**super().params(), "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau}


class DiLoCo(_Stateful):
    """DiLoCo's outer optimizer (Douillard et al. 2023): Nesterov SGD on the outer gradient.

    The outer gradient is g = -(sample-weighted mean delta). Exactly torch.optim.SGD with
    nesterov=True, dampening=0, weight_decay=0:
        first round: buf = g              (torch initialises the buffer to the gradient)
        later:       buf = momentum * buf + g
        x = x - server_lr * (g + momentum * buf)
    With momentum=0 this is FedAvg.
    """

    name: ClassVar[str] = "diloco"
    slots: ClassVar[tuple[str, ...]] = ("buf",)

    def __init__(self, server_lr: float = 0.7, momentum: float = 0.9) -> None:
        super().__init__(server_lr)
        self.momentum = _unit_interval("momentum", momentum)

    def _apply(self, global_state: Mapping[str, Tensor], combined: StateDict) -> StateDict:
        first = self._step == 0
        slots = self._slots_for(global_state)
        step: StateDict = {}
        for name in global_state:
            buf = slots["buf"][name]
            g = combined[name].to(device=buf.device, dtype=buf.dtype).neg_()
            if first:
                buf.copy_(g)
            else:
                buf.mul_(self.momentum).add_(g)
            step[name] = g.add_(buf, alpha=self.momentum)
        self._step += 1
        return apply_delta(global_state, step, scale=-self.server_lr)

    def params(self) -> dict[str, float | int | str]:
        return {**super().params(), "momentum": self.momentum}


class TrimmedMean(Strategy):
    """Coordinate-wise trimmed mean of deltas (unweighted).

    Sample counts are ignored on purpose: weighting would let a Byzantine node buy influence
    by claiming many samples.
    """

    name: ClassVar[str] = "trimmed_mean"

    def __init__(self, trim_fraction: float = 0.2, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        if not 0.0 <= float(trim_fraction) < 0.5:
            raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
        self.trim_fraction = float(trim_fraction)

    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        deltas = [u.delta for u in updates]
        return trimmed_mean(deltas, self.trim_fraction, dtype=torch.float64)

    def params(self) -> dict[str, float | int | str]:
        return {**super().params(), "trim_fraction": self.trim_fraction}


class Median(Strategy):
    """Coordinate-wise median of deltas (unweighted; mean of the two middles for even n)."""

    name: ClassVar[str] = "median"

    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        return coordinate_median([u.delta for u in updates], dtype=torch.float64)


class MultiKrum(Strategy):
    """Multi-Krum over deltas (unweighted): tolerates `byzantine` bad updates of n > 2f + 2.

    `select` updates are averaged (None: n - byzantine). After each round, `last_selected`
    holds the node ids that were kept, for provenance.
    """

    name: ClassVar[str] = "krum"

    def __init__(
        self, byzantine: int = 2, select: int | None = None, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr)
        if isinstance(byzantine, bool) or not isinstance(byzantine, int) or byzantine < 0:
            raise ValueError(f"byzantine must be an int >= 0, got {byzantine!r}")
        if select is not None and (
            isinstance(select, bool) or not isinstance(select, int) or select < 1
        ):
            raise ValueError(f"select must be an int >= 1 or None, got {select!r}")
        self.byzantine = byzantine
        self.select = select
        self.last_selected: list[str] = []

    def _combine(self, updates: Iterable[ClientUpdate]) -> StateDict:
        updates = list(updates)
        combined, chosen = multi_krum(
            [u.delta for u in updates], self.byzantine, self.select, dtype=torch.float64
        )
        self.last_selected = [updates[i].node_id for i in chosen]
        return combined

    def params(self) -> dict[str, float | int | str]:
        select = "n-f" if self.select is None else self.select
        return {**super().params(), "byzantine": self.byzantine, "select": select}


def build_strategy(spec: AggregationSpec) -> Strategy:
    """The strategy a job spec's `aggregation` section asks for."""
    lr = spec.server_lr
    match spec.strategy:
        case "fedavg":
            return FedAvg(server_lr=lr)
        case "fedprox":
            return FedProx(mu=spec.mu, server_lr=lr)
        case "fedadam":
            return FedAdam(server_lr=lr, beta1=spec.beta1, beta2=spec.beta2, tau=spec.tau)
        case "diloco":
            return DiLoCo(server_lr=lr, momentum=spec.momentum)
        case "trimmed_mean":
            return TrimmedMean(trim_fraction=spec.trim_fraction, server_lr=lr)
        case "median":
            return Median(server_lr=lr)
        case "krum":
            return MultiKrum(byzantine=spec.byzantine, select=spec.krum_select, server_lr=lr)
    raise ValueError(f"unknown aggregation strategy {spec.strategy!r}")


def min_updates(spec: AggregationSpec) -> int:
    """The fewest updates a round must bring for `spec`'s strategy to aggregate it.

    Krum scores each update against its n - f - 2 nearest others (n > 2f + 2) and Multi-Krum
    averages `krum_select` of them; every other strategy takes any n >= 1 (a trimmed mean cuts
    floor(trim_fraction * n) < n / 2 values per side, so some always remain).
    """
    if spec.strategy != "krum":
        return 1
    return max(krum_min_updates(spec.byzantine), spec.krum_select or 1)


def round_size_problems(
    spec: AggregationSpec, updates: int, source: str = ""
) -> list[tuple[str, str]]:
    """(field path, reason) for each setting that keeps rounds of `updates` updates from
    aggregating under `spec`; empty when they can (exactly when updates >= min_updates).

    Coordinators call this before a job starts: the strategy itself would only fail at the
    first aggregation. `source` says where the count comes from, for the reason.
    """
    if spec.strategy != "krum":
        return []
    where = f" ({source})" if source else ""
    problems = []
    f, need = spec.byzantine, krum_min_updates(spec.byzantine)
    if updates < need:
        fix = (
            f"set byzantine to at most {(updates - 3) // 2} or give each round more updates"
            if updates >= 3
            else "Krum needs 3 whatever byzantine is, so give each round more updates"
        )
        problems.append(
            (
                "aggregation.byzantine",
                f"krum with byzantine={f} needs at least {need} updates a round (n > 2f + 2), "
                f"but a round here can count on {updates}{where}; {fix}",
            )
        )
    if spec.krum_select is not None and spec.krum_select > updates:
        problems.append(
            (
                "aggregation.krum_select",
                f"krum cannot select {spec.krum_select} updates when a round here can count on "
                f"{updates}{where}",
            )
        )
    return problems
