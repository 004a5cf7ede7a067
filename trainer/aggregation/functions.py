"""Aggregation rules as pure functions over state dicts (``dict[str, Tensor]``).

All arithmetic runs in float64 and the result is rounded once to the updates' dtype (or to
`dtype` when given), so the order updates arrive in barely matters and small models give
exact, hand-checkable numbers. Inputs are never modified.

Robust rules (trimmed mean, median, Multi-Krum) assume finite inputs: updates are checked
by `trainer.updates.validate_update` when they are decoded, before they get here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

StateDict = dict[str, Tensor]
# (shape, dtype) per tensor name: what every update of one round must share
Structure = dict[str, tuple[torch.Size, torch.dtype]]


# --------------------------------------------------------------------------- helpers


def structure_of(state: Mapping[str, Tensor], index: int = 0) -> Structure:
    """Names, shapes and dtypes of a state dict; all tensors must be floating."""
    out: Structure = {}
    for name, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise TypeError(f"update {index}: '{name}' is {type(tensor).__name__}, not a tensor")
        if not tensor.is_floating_point():
            raise TypeError(f"update {index}: '{name}' has non-floating dtype {tensor.dtype}")
        out[name] = (tensor.shape, tensor.dtype)
    if not out:
        raise ValueError(f"update {index} has no tensors")
    return out


def check_structure(expected: Structure, state: Mapping[str, Tensor], index: int) -> None:
    """Raise ValueError naming the first tensor where `state` differs from `expected`."""
    if state.keys() != expected.keys():
        missing = sorted(set(expected) - set(state))
        extra = sorted(set(state) - set(expected))
        raise ValueError(f"update {index}: keys differ (missing {missing}, unexpected {extra})")
    for name, (shape, dtype) in expected.items():
        tensor = state[name]
        if not isinstance(tensor, Tensor):
            raise TypeError(f"update {index}: '{name}' is {type(tensor).__name__}, not a tensor")
        if tensor.shape != shape:
            raise ValueError(
                f"update {index}: '{name}' has shape {list(tensor.shape)}, expected {list(shape)}"
            )
        if tensor.dtype != dtype:
            raise ValueError(f"update {index}: '{name}' has dtype {tensor.dtype}, expected {dtype}")


def _common_structure(updates: Sequence[Mapping[str, Tensor]]) -> Structure:
    if len(updates) == 0:
        raise ValueError("no updates to aggregate")
    expected = structure_of(updates[0], 0)
    for index, state in enumerate(updates[1:], start=1):
        check_structure(expected, state, index)
    return expected


def flatten_state(state: Mapping[str, Tensor], dtype: torch.dtype | None = None) -> Tensor:
    """All tensors of `state` as one 1-D tensor, in sorted key order (see `unflatten_state`)."""
    parts = [state[name].detach().reshape(-1) for name in sorted(state)]
    flat = torch.cat(parts) if parts else torch.empty(0)
    return flat if dtype is None else flat.to(dtype)


def unflatten_state(flat: Tensor, like: Mapping[str, Tensor]) -> StateDict:
    """Inverse of `flatten_state`: split `flat` into the shapes and dtypes of `like`."""
    total = sum(like[name].numel() for name in like)
    if flat.dim() != 1 or flat.numel() != total:
        raise ValueError(f"flat tensor has shape {list(flat.shape)}, expected [{total}]")
    out: StateDict = {}
    offset = 0
    for name in sorted(like):
        ref = like[name]
        out[name] = flat[offset : offset + ref.numel()].reshape(ref.shape).to(ref.dtype).clone()
        offset += ref.numel()
    return out


def _stack(updates: Sequence[Mapping[str, Tensor]], name: str) -> Tensor:
    """[n, *shape] float64 copy of one tensor across updates (one allocation, no temporaries)."""
    first = updates[0][name]
    out = torch.empty((len(updates), *first.shape), dtype=torch.float64, device=first.device)
    for i, state in enumerate(updates):
        out[i].copy_(state[name].detach())
    return out


def _out_dtype(structure: Structure, name: str, dtype: torch.dtype | None) -> torch.dtype:
    return structure[name][1] if dtype is None else dtype


def _check_weight(weight: float, index: int) -> float:
    """Weights are sample counts or similar: a zero, negative or NaN one is a caller bug."""
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise TypeError(f"update {index}: weight {weight!r} is not a number") from None
    if not (math.isfinite(w) and w > 0):
        raise ValueError(f"update {index}: weight {weight!r} must be finite and > 0")
    return w


# ------------------------------------------------------------------------ aggregators


def weighted_mean(
    updates: Iterable[tuple[Mapping[str, Tensor], float]], *, dtype: torch.dtype | None = None
) -> StateDict:
    """``sum(w_i * u_i) / sum(w_i)``, streaming.

    Consumes `updates` one at a time into a float64 running sum and drops each update as
    soon as the next one is taken, so memory is the accumulator plus at most two updates
    (the one being added and the one the iterator is producing) however many nodes there
    are: a coordinator can feed decoded payloads straight in. Weights must be finite and
    > 0; an empty input is a ValueError.
    """
    acc: StateDict | None = None
    expected: Structure = {}
    total = 0.0
    for index, (state, weight) in enumerate(updates):
        w = _check_weight(weight, index)
        if acc is None:
            expected = structure_of(state, index)
            acc = {
                name: torch.zeros(shape, dtype=torch.float64, device=state[name].device)
                for name, (shape, _) in expected.items()
            }
        else:
            check_structure(expected, state, index)
        for name, running in acc.items():
            running.add_(state[name].detach(), alpha=w)
        total += w
    if acc is None:
        raise ValueError("no updates to aggregate")
    return {
        name: running.div_(total).to(_out_dtype(expected, name, dtype))
        for name, running in acc.items()
    }


def mean(updates: Iterable[Mapping[str, Tensor]], *, dtype: torch.dtype | None = None) -> StateDict:
    """Unweighted mean (streaming, like `weighted_mean`)."""
    return weighted_mean(((state, 1.0) for state in updates), dtype=dtype)


def trim_count(n: int, trim_fraction: float) -> int:
    """floor(trim_fraction * n), robust to float error (0.29 * 100 must give 29, not 28)."""
    return math.floor(trim_fraction * n + 1e-9)


def trimmed_mean(
    updates: Sequence[Mapping[str, Tensor]],
    trim_fraction: float,
    *,
    dtype: torch.dtype | None = None,
) -> StateDict:
    """Coordinate-wise trimmed mean (Yin et al. 2018).

    For each coordinate, drop the k = floor(trim_fraction * n) largest and k smallest
    values and average the remaining n - 2k. trim_fraction must lie in [0, 0.5), so at
    least one value always remains; 0 gives the plain mean.
    """
    if not (0.0 <= trim_fraction < 0.5):
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
    updates = list(updates)
    expected = _common_structure(updates)
    n = len(updates)
    k = trim_count(n, trim_fraction)
    out: StateDict = {}
    for name in expected:
        ordered = torch.sort(_stack(updates, name), dim=0).values
        out[name] = ordered[k : n - k].mean(dim=0).to(_out_dtype(expected, name, dtype))
    return out


def coordinate_median(
    updates: Sequence[Mapping[str, Tensor]], *, dtype: torch.dtype | None = None
) -> StateDict:
    """Coordinate-wise median (Yin et al. 2018).

    The true median: for an even number of updates, the mean of the two middle values.
    (`torch.median` returns the lower of the two, which biases the result downward.)
    """
    updates = list(updates)
    expected = _common_structure(updates)
    n = len(updates)
    out: StateDict = {}
    for name in expected:
        ordered = torch.sort(_stack(updates, name), dim=0).values
        middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        out[name] = middle.to(_out_dtype(expected, name, dtype))
    return out


def pairwise_sq_distances(updates: Sequence[Mapping[str, Tensor]]) -> Tensor:
    """[n, n] float64 matrix of squared L2 distances between whole updates.

    Computed from differences (not the |a|^2 + |b|^2 - 2ab expansion), so it is exact for
    small integers and never negative.
    """
    updates = list(updates)
    expected = _common_structure(updates)
    n = len(updates)
    dist = torch.zeros((n, n), dtype=torch.float64)
    for name in expected:
        stacked = _stack(updates, name).reshape(n, -1)
        for i in range(n):
            dist[i] += (stacked - stacked[i]).square_().sum(dim=1).cpu()
    return dist


def krum_min_updates(f: int) -> int:
    """The fewest updates Krum can score while tolerating f Byzantine ones: n > 2f + 2."""
    return 2 * f + 3


def _check_krum(n: int, f: int) -> None:
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise ValueError(f"the number of Byzantine updates f must be an int >= 0, got {f!r}")
    if n < krum_min_updates(f):
        raise ValueError(
            f"Krum needs n > 2f + 2 updates to tolerate f={f} Byzantine ones; got n={n} "
            f"(need at least {krum_min_updates(f)})"
        )


def krum_scores(updates: Sequence[Mapping[str, Tensor]], f: int) -> list[float]:
    """Krum scores (Blanchard et al. 2017).

    The score of update i is the sum of squared distances to its n - f - 2 closest other
    updates; honest updates cluster, so they score low. Requires n > 2f + 2.
    """
    updates = list(updates)
    n = len(updates)
    _check_krum(n, f)
    dist = pairwise_sq_distances(updates)
    dist.fill_diagonal_(math.inf)  # an update is not its own neighbour
    closest = torch.sort(dist, dim=1).values[:, : n - f - 2]
    return closest.sum(dim=1).tolist()


def multi_krum(
    updates: Sequence[Mapping[str, Tensor]],
    f: int,
    m: int | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> tuple[StateDict, list[int]]:
    """Multi-Krum (Blanchard et al. 2017): the unweighted mean of the m lowest-scoring updates.

    m=None selects n - f; m=1 is plain Krum. Ties in score go to the lower index. Returns
    (mean, indices of the selected updates in ascending order).
    """
    updates = list(updates)
    n = len(updates)
    scores = krum_scores(updates, f)
    m = n - f if m is None else m
    if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= n:
        raise ValueError(f"Multi-Krum must select between 1 and n={n} updates, got m={m!r}")
    ranked = sorted(range(n), key=lambda i: (scores[i], i))
    selected = sorted(ranked[:m])
    return mean((updates[i] for i in selected), dtype=dtype), selected
