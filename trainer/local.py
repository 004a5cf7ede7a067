"""Local training: one node's work in one round, from a global state to an update.

Kept close to a plain PyTorch loop (tensor slicing instead of a DataLoader) so that
its overhead over hand-written training stays within a few percent (see bench/).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from trainer.datasets import IGNORE_INDEX, Dataset
from trainer.spec import JobSpec, OptimizerSpec, PrivacySpec


@dataclass
class LocalResult:
    delta: dict[str, torch.Tensor]  # local state minus global state
    num_samples: int
    steps: int
    loss: float  # mean training loss over the steps
    compute_s: float  # wall seconds spent training on this host
    metrics: dict[str, float] = field(default_factory=dict)


def derive_seed(seed: int, round_: int, node: int) -> int:
    """A task's training seed: independent, reproducible streams per (job seed, round, node or
    shard), the same in the simulator and on the marketplace; resuming never replays one."""
    return (seed * 1_000_003 + round_ * 10_007 + node * 101 + 17) % (2**63)


def make_optimizer(params: list[nn.Parameter], spec: OptimizerSpec) -> torch.optim.Optimizer:
    if spec.name == "sgd":
        return torch.optim.SGD(
            params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


def planned_steps(spec: JobSpec, num_samples: int, batch_size: int | None = None) -> int:
    batch = batch_size or spec.local.batch_size
    if spec.local.steps is not None:
        return spec.local.steps
    return max(1, math.ceil(spec.local.epochs * num_samples / batch))  # type: ignore[operator]


def loss_fn(logits: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    if task == "language_model":
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX
        )
    return F.cross_entropy(logits, y)


def _batches(n: int, batch: int, steps: int, gen: torch.Generator):
    """Index batches over successive shuffled epochs; the last partial batch of an epoch is kept."""
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos >= n:
            perm, pos = torch.randperm(n, generator=gen), 0
        yield perm[pos : pos + batch]
        pos += batch


def _privatize(
    delta: dict[str, torch.Tensor], privacy: PrivacySpec, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """Clip the whole update to clip_norm, add Gaussian noise scaled to the clip (DP-FedAvg)."""
    if privacy.clip_norm is None:
        return delta
    norm = torch.sqrt(sum((t.double() ** 2).sum() for t in delta.values())).item()
    scale = min(1.0, privacy.clip_norm / max(norm, 1e-12))
    sigma = privacy.noise_multiplier * privacy.clip_norm
    out = {}
    for key, t in delta.items():
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype) * sigma if sigma else 0.0
        out[key] = t * scale + noise
    return out


def train_local(
    model: nn.Module,
    global_state: Mapping[str, torch.Tensor],
    data: Dataset,
    spec: JobSpec,
    *,
    seed: int,
    steps: int | None = None,
    batch_size: int | None = None,
    proximal_mu: float = 0.0,
) -> LocalResult:
    """Train `model` (reused across calls to save allocations) from `global_state` on `data`.

    Deterministic for (global_state, data, spec, seed) on a given device.
    """
    device = next(model.parameters()).device
    model.load_state_dict(global_state)
    model.train()
    batch = batch_size or spec.local.batch_size
    n = data.num_train
    steps = steps if steps is not None else planned_steps(spec, n, batch)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout
    x_all, y_all = data.x_train.to(device), data.y_train.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() for p in params] if proximal_mu > 0 else []
    opt = make_optimizer(params, spec.optimizer)

    started = time.perf_counter()
    loss_total = torch.zeros((), device=device)
    for idx in _batches(n, batch, steps, gen):
        idx = idx.to(device)
        loss = loss_fn(model(x_all[idx]), y_all[idx], data.task)
        if proximal_mu > 0:  # FedProx keeps local weights near the global model
            prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))
            loss = loss + 0.5 * proximal_mu * prox
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_total += loss.detach()
    mean_loss = float(loss_total) / steps  # one device sync, after the loop
    compute_s = time.perf_counter() - started

    local = model.state_dict()
    delta = {k: (local[k].detach().cpu() - global_state[k].cpu()) for k in global_state}
    delta = _privatize(delta, spec.privacy, gen)
    return LocalResult(
        delta=delta,
        num_samples=n,
        steps=steps,
        loss=mean_loss,
        compute_s=compute_s,
        metrics={"loss": mean_loss, "steps": float(steps), "samples": float(n)},
    )
