"""Local training: one node's work in one round, from a global state to an update.

Kept close to a plain PyTorch loop (tensor slicing instead of a DataLoader) so that
its overhead over hand-written training stays within a few percent (see bench/). On a GPU it
does what a tuned loop does: mixed precision, TF32, fused optimizers, the data and the whole
batch schedule on the device up front, and no host sync until the end.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from trainer.datasets import IGNORE_INDEX, Dataset
from trainer.exported.runtime import is_program, loss_and_logits
from trainer.lora import update_keys
from trainer.privacy import privatize_update
from trainer.resume import PausedState, TrainingPaused, capture, restore
from trainer.spec import JobSpec, OptimizerSpec
from trainer.steps import derive_seed, planned_steps  # noqa: F401 (derive_seed: re-exported)


@dataclass
class LocalResult:
    # local state minus global state, over the tensors an update carries (trainer.lora)
    delta: dict[str, torch.Tensor]
    num_samples: int
    steps: int
    loss: float  # mean training loss over the steps
    compute_s: float  # wall seconds spent training on this host
    metrics: dict[str, float] = field(default_factory=dict)
    precision: str = "fp32"  # what ran: "fp32", "bf16" or "fp16"


def make_optimizer(
    params: list[nn.Parameter], spec: OptimizerSpec, fused: bool = False, lr: float | None = None
) -> torch.optim.Optimizer:
    """`fused`: one kernel for the whole update (CUDA), which also lets a GradScaler skip
    inf/NaN steps without a host sync. `lr`: the round's rate (trainer.schedule.round_lr)
    in place of the spec's base rate."""
    opts = {
        "lr": spec.lr if lr is None else lr,
        "weight_decay": spec.weight_decay,
        "fused": fused or None,
    }
    if spec.name == "sgd":
        return torch.optim.SGD(params, momentum=spec.momentum, **opts)
    if spec.name == "adam":
        return torch.optim.Adam(params, **opts)
    return torch.optim.AdamW(params, **opts)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(
    requested: str, device: torch.device, capability: tuple[int, int] | None = None
) -> str:
    """The precision that `local.precision` means on `device`: "fp32", "bf16" or "fp16".

    "auto" is bf16 on GPUs with native bf16 (compute capability 8.0+, and ROCm), fp16 with
    loss scaling on older GPUs, fp32 elsewhere (CPU autocast rarely pays; MPS's is young).
    `capability` overrides the CUDA compute capability that is otherwise queried.
    """
    if requested == "fp32":
        return "fp32"
    if device.type == "cuda":
        cap = capability or torch.cuda.get_device_capability(device)
        native_bf16 = torch.version.hip is not None or cap >= (8, 0)
        if requested == "auto":
            return "bf16" if native_bf16 else "fp16"
        if requested == "bf16" and not native_bf16:
            raise ValueError(
                f"local.precision 'bf16' needs a GPU of compute capability 8.0 or newer; "
                f"this one is {cap[0]}.{cap[1]}: use 'fp16' or 'auto'"
            )
        return requested
    if requested == "auto":
        return "fp32"
    if requested not in _DTYPES or not _can_autocast(device.type, _DTYPES[requested]):
        raise ValueError(f"local.precision {requested!r} is not supported on {device.type}")
    return requested


def _can_autocast(device_type: str, dtype: torch.dtype) -> bool:
    if not torch.amp.is_autocast_available(device_type):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns, then disables autocast for a dtype it lacks
        with torch.autocast(device_type, dtype=dtype):
            return torch.is_autocast_enabled(device_type)


def loss_fn(
    logits: torch.Tensor, y: torch.Tensor, task: str, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy; for a language model over every token, padding (IGNORE_INDEX) left out.
    `reduction="sum"` lets micro-batches add up to the whole batch's mean."""
    if task == "language_model":
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction=reduction)


def _schedule(
    n: int, batch: int, steps: int, gen: torch.Generator
) -> tuple[torch.Tensor, list[int]]:
    """Every step's sample indices up front, as one tensor and the steps' boundaries in it:
    successive shuffled epochs, the last partial batch of an epoch kept. One tensor is one
    copy to the device per task instead of one per step."""
    perms, bounds, pos = [], [0], n
    for _ in range(steps):
        if pos >= n:
            perms.append(torch.randperm(n, generator=gen))
            pos = 0
        size = min(batch, n - pos)
        pos += size
        bounds.append(bounds[-1] + size)
    return torch.cat(perms), bounds


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and t.device.type == "cpu":  # pinned: an asynchronous copy
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def run_identity(
    seed: int,
    steps: int,
    batch: int,
    accum: int,
    samples: int,
    precision: str,
    proximal_mu: float,
    lr: float,
) -> dict[str, object]:
    """What a paused state must match to be resumed by a train_local call (trainer.resume);
    a verifier re-running a segment states its own (trainer.proof)."""
    return {"seed": seed, "steps": steps, "batch": batch, "accum": accum, "samples": samples,
            "precision": precision, "proximal_mu": proximal_mu, "lr": lr}  # fmt: skip


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
    lr: float | None = None,
    pause: Callable[[], bool] | None = None,
    resume: PausedState | None = None,
    checkpoints: Collection[int] = (),
    on_checkpoint: Callable[[PausedState], None] | None = None,
) -> LocalResult:
    """Train `model` (reused across calls to save allocations) from `global_state` on `data`.

    Deterministic for (global_state, data, spec, seed) on a given device and precision. Each
    step's batch is split into `spec.local.grad_accum_steps` micro-batches whose losses are
    weighted so that the gradient is the whole batch's.

    `pause` is asked before every step; when it answers True the run stops there and raises
    TrainingPaused with its state, which `resume` takes back to finish the same run with the
    same result as if it had never stopped (trainer.resume).

    `lr` is the round's learning rate (trainer.schedule.round_lr; the spec's `optimizer.lr`
    when None), constant through the local steps.

    `checkpoints`: step counts (0 to the run's steps) at which `on_checkpoint` is handed the
    run's state as a pause would capture it, the run going on unchanged (copies to the CPU,
    no RNG drawn): the boundaries a proof of learning commits to (trainer.proof).
    """
    device = next(model.parameters()).device
    if spec.privacy.mode == "sample" and spec.privacy.clip_norm is not None:
        return _train_sample_private(model, global_state, data, spec, steps, batch_size)
    precision = resolve_precision(spec.local.precision, device)
    on_cuda = device.type == "cuda"
    if on_cuda:  # tensor cores (TF32) for the matmuls and convolutions that stay in fp32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model.load_state_dict(global_state)
    model.train()
    batch = batch_size or spec.local.batch_size
    accum = spec.local.grad_accum_steps
    n = data.num_train
    steps = steps if steps is not None else planned_steps(spec, n, batch)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout
    order, bounds = _schedule(n, batch, steps, gen)
    x_all, y_all = _to_device(data.x_train, device), _to_device(data.y_train, device)
    order = _to_device(order, device)
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() for p in params] if proximal_mu > 0 else []
    opt = make_optimizer(params, spec.optimizer, fused=on_cuda, lr=lr)
    autocast = (
        torch.autocast(device.type, dtype=_DTYPES[precision])
        if precision in _DTYPES
        else contextlib.nullcontext()
    )
    # fp16 overflows without loss scaling; bf16 has fp32's range and needs none. The scale
    # starts at 2^10, not torch's 2^16: at 2^16 the first step overflows for ordinary losses
    # and is skipped, and an honest fp16 replica then drifts from its fp32 and bf16 peers as
    # far as a copied update does (bench/replica_divergence.py). Short tasks never grow it back.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10) if precision == "fp16" else None
    lm = data.task == "language_model"
    program = is_program(model)  # a buyer's program computes its own (mean) loss
    # what a paused state must match to be resumed by this call
    identity = run_identity(seed, steps, batch, accum, n, precision, proximal_mu,
                            spec.optimizer.lr if lr is None else lr)  # fmt: skip
    wanted = set(checkpoints) if on_checkpoint is not None else set()

    started = time.perf_counter()
    loss_total = torch.zeros((), device=device)
    first, before_s = 0, 0.0
    if resume is not None:
        loss_total = restore(resume, model, opt, scaler, identity)
        first, before_s = resume.step, float(resume.meta.get("compute_s", 0.0))
    for step in range(first, steps):
        if pause is not None and pause():
            paused = capture(step, model, opt, scaler, loss_total, identity)
            paused.meta["compute_s"] = before_s + time.perf_counter() - started
            raise TrainingPaused(paused)
        if step in wanted:
            on_checkpoint(_kept(capture(step, model, opt, scaler, loss_total, identity)))  # type: ignore[misc]
        idx = order[bounds[step] : bounds[step + 1]]
        opt.zero_grad(set_to_none=True)
        if accum == 1:
            micro, weight = (idx,), None
        else:  # summed micro-batch losses over the whole batch's count: the batch's mean
            micro = [m for m in idx.tensor_split(accum) if len(m)]
            weight = y_all.index_select(0, idx).ne(IGNORE_INDEX).sum() if lm else len(idx)
        for i, mi in enumerate(micro):
            with autocast:
                y = y_all.index_select(0, mi)
                if program:  # its mean over the micro-batch, weighted to the batch's mean
                    loss, _ = loss_and_logits(model, x_all.index_select(0, mi), y)
                    loss = loss if weight is None else loss * (len(mi) / weight)
                elif weight is None:
                    logits = model(x_all.index_select(0, mi))
                    loss = loss_fn(logits, y, data.task)
                else:
                    logits = model(x_all.index_select(0, mi))
                    loss = loss_fn(logits, y, data.task, reduction="sum") / weight
            if proximal_mu > 0 and i == 0:  # FedProx keeps local weights near the global model
                prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))
                loss = loss + 0.5 * proximal_mu * prox
            (scaler.scale(loss) if scaler else loss).backward()
            loss_total += loss.detach()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    if steps in wanted:
        on_checkpoint(_kept(capture(steps, model, opt, scaler, loss_total, identity)))  # type: ignore[misc]
    mean_loss = float(loss_total) / steps  # one device sync, after the loop
    compute_s = before_s + time.perf_counter() - started

    local = model.state_dict()
    # a LoRA model's update is its adapters alone: the frozen base never moves, never travels
    delta = {
        k: (local[k].detach().cpu() - global_state[k].cpu())
        for k in update_keys(spec.model, global_state)
    }
    delta = privatize_update(delta, spec.privacy)
    return LocalResult(
        delta=delta,
        num_samples=n,
        steps=steps,
        loss=mean_loss,
        compute_s=compute_s,
        metrics={"loss": mean_loss, "steps": float(steps), "samples": float(n)},
        precision=precision,
    )


def _kept(state: PausedState) -> PausedState:
    # on the CPU, capture's tensors are the live weights and moments (.cpu() copies nothing):
    # a checkpoint the run goes on after must be a copy
    return PausedState(state.step, {k: v.clone() for k, v in state.tensors.items()}, state.meta)


def _train_sample_private(
    model: nn.Module,
    global_state: Mapping[str, torch.Tensor],
    data: Dataset,
    spec: JobSpec,
    steps: int | None,
    batch_size: int | None,
) -> LocalResult:
    """`privacy.mode: sample`: Opacus's DP-SGD (trainer/dp_sgd.py), in fp32, then the whole
    update clipped as for every private job. Not deterministic, by design: its batches and
    noise come from the OS's randomness."""
    # Opacus, and SciPy under it, only for these jobs: 65 MB and 2 s a warm task runner
    # (desktop/task_zygote.py) does not carry for every other job
    from trainer.dp_sgd import train_dp_sgd

    model.load_state_dict(global_state)
    model.train()
    batch = batch_size or spec.local.batch_size
    n = data.num_train
    steps = steps if steps is not None else planned_steps(spec, n, batch)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, spec.optimizer)
    started = time.perf_counter()
    run = train_dp_sgd(
        model, opt, data, lambda logits, y: loss_fn(logits, y, data.task),
        steps=steps, batch_size=batch, clip_norm=spec.privacy.clip_norm or 0.0,
        noise_multiplier=spec.privacy.noise_multiplier,
    )  # fmt: skip
    compute_s = time.perf_counter() - started
    local = model.state_dict()
    delta = {
        k: (local[k].detach().cpu() - global_state[k].cpu())
        for k in update_keys(spec.model, global_state)
    }
    mean_loss = run.loss_sum / max(run.steps, 1)
    return LocalResult(
        delta=privatize_update(delta, spec.privacy),
        num_samples=n,
        steps=run.steps,
        loss=mean_loss,
        compute_s=compute_s,
        metrics={"loss": mean_loss, "steps": float(run.steps), "samples": float(n)},
        precision="fp32",
    )
