"""Sample-level DP-SGD for a task (`privacy.mode: sample`), with Opacus.

Opacus computes each example's gradient (GradSampleModule), clips it to `clip_norm` and adds
Gaussian noise of `noise_multiplier x clip_norm` to the batch's sum (DPOptimizer). Batches are
Poisson-sampled (each example in with probability batch/rows, independently), which is what
the RDP accountant's amplification by sampling assumes. The batch draws and the noise come
from a generator seeded from os.urandom: the server never knows the seed. Such a run is fp32
and is not paused with a checkpoint (a pause abandons it; the task is leased again).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn

from trainer.datasets import Dataset


class DPUnsupported(ValueError):
    """The model has layers per-example gradients cannot be computed for (BatchNorm...)."""


def check_model(model: nn.Module) -> None:
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        names = sorted({type(e).__name__ + ": " + str(e).split("\n")[0] for e in errors})
        raise DPUnsupported(
            "privacy.mode 'sample' cannot train this model: " + "; ".join(names[:3])
        )


@dataclass
class DPRun:
    loss_sum: float
    steps: int


def train_dp_sgd(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Dataset,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    steps: int,
    batch_size: int,
    clip_norm: float,
    noise_multiplier: float,
) -> DPRun:
    """`steps` DP-SGD steps of `model` (its parameters are `optimizer`'s) on `data`'s train
    split; `loss_of(logits, y)` is the batch's mean loss."""
    check_model(model)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    wrapped = GradSampleModule(model)
    dp = DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=clip_norm,
        expected_batch_size=batch_size,
        generator=gen,
    )
    x_all, y_all = data.x_train.to(device), data.y_train.to(device)
    n = len(y_all)
    rate = min(1.0, batch_size / max(n, 1))
    loss_sum = 0.0
    try:
        for _ in range(steps):
            take = torch.rand(n, generator=gen, device=device) < rate
            idx = take.nonzero().squeeze(1)
            dp.zero_grad(set_to_none=True)
            # an empty Poisson batch (probability about e^-batch) goes through all the same:
            # Opacus adds the step's noise to zero gradients, as the accountant assumes
            loss = loss_of(wrapped(x_all.index_select(0, idx)), y_all.index_select(0, idx))
            with warnings.catch_warnings():
                # Opacus's hooks fire on module outputs: the inputs need no gradient here
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            dp.step()
            if len(idx):
                loss_sum += float(loss.detach())
    finally:
        wrapped._close()  # removes Opacus's hooks: the model is reused for the next task
    return DPRun(loss_sum=loss_sum, steps=steps)
