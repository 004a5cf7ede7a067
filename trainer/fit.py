"""Does a task fit in a device's memory? Weights, gradients, optimizer state and activations.

Two halves. `measure_footprint` builds the model on the meta device (no memory) and runs one
sample through it in training mode, counting the bytes autograd keeps for the backward pass:
the marketplace does this once per job at submission and sends the footprint with each task.
`estimate_memory` and `fits` are plain arithmetic on it, with no torch import, so the agent
(which never imports torch) checks a task against its free GPU memory, or RAM on a CPU node,
before it takes the task on.

The estimate is for fp32 training, the most a task can need: mixed precision halves the
activations. Frozen weights (a LoRA base) need no gradient or optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# what a CUDA context and the allocator's fragmentation take beyond the tensors
CUDA_OVERHEAD_BYTES = 512 * 2**20
# optimizer state per trainable parameter, in fp32 values
_OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Footprint:
    """A model's size as training sees it, independent of the batch."""

    parameters: int  # every parameter, frozen ones included
    trainable: int  # those the optimizer updates
    state_bytes: int  # the fp32 state dict (parameters and buffers)
    activation_bytes: int  # kept for the backward pass, per sample

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Footprint:
        values = {k: int(data[k]) for k in ("parameters", "trainable", "state_bytes",
                                            "activation_bytes")}  # fmt: skip
        if any(v < 0 for v in values.values()):
            raise ValueError("a footprint's sizes are not negative")
        return cls(**values)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def describe(self) -> str:
        gib = 2**30
        return (
            f"{self.total / gib:.2f} GiB (weights {self.weights / gib:.2f}, gradients "
            f"{self.gradients / gib:.2f}, optimizer {self.optimizer / gib:.2f}, activations "
            f"{self.activations / gib:.2f}, overhead {self.overhead / gib:.2f})"
        )


def estimate_memory(
    footprint: Footprint,
    *,
    optimizer: str,
    momentum: float = 0.0,
    batch_size: int,
    grad_accum_steps: int = 1,
    gpu: bool = False,
) -> MemoryEstimate:
    """What training one task takes: a micro-batch's activations live at a time."""
    slots = _OPTIMIZER_SLOTS.get(optimizer, 1 if momentum > 0 else 0)
    micro = math.ceil(max(batch_size, 1) / max(grad_accum_steps, 1))
    return MemoryEstimate(
        weights=footprint.state_bytes,
        gradients=4 * footprint.trainable,
        optimizer=4 * slots * footprint.trainable,
        activations=footprint.activation_bytes * micro,
        overhead=CUDA_OVERHEAD_BYTES if gpu else 0,
    )


def fits(estimate: MemoryEstimate, free_bytes: int, headroom: float = 0.9) -> bool:
    """Whether the estimate fits in `headroom` of the free memory (the rest for what the
    estimate leaves out: workspace, temporaries of the optimizer step)."""
    return estimate.total <= headroom * free_bytes


def check_task(task: dict[str, Any], free_bytes: int, gpu: bool) -> str | None:
    """Why a claimed task (the marketplace's task payload: its `footprint`, `spec` and
    `batch_size`) would not fit in `free_bytes`, or None when it fits or cannot be judged
    (a task without a footprint). Plain arithmetic, for the agent, which never imports torch."""
    raw = task.get("footprint")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        footprint = Footprint.from_dict(raw)
        spec = task.get("spec") or {}
        opt, local = spec.get("optimizer") or {}, spec.get("local") or {}
        estimate = estimate_memory(
            footprint,
            optimizer=str(opt.get("name", "sgd")),
            momentum=float(opt.get("momentum") or 0.0),
            batch_size=int(task.get("batch_size") or local.get("batch_size") or 1),
            grad_accum_steps=int(local.get("grad_accum_steps") or 1),
            gpu=gpu,
        )
    except (KeyError, TypeError, ValueError):
        return None  # a malformed payload is the runner's to refuse, with its own checks
    if fits(estimate, free_bytes):
        return None
    where = "GPU memory" if gpu else "RAM"
    return f"needs {estimate.describe()}; {free_bytes / 2**30:.2f} GiB of {where} is free"


def measure_footprint(
    spec: Any,
    input_shape: tuple[int, ...],
    num_classes: int,
    integer_input: bool = False,
    weights: Any = None,
) -> Footprint:
    """The footprint of `spec` (a ModelSpec) on this data, measured on the meta device.
    `weights`: a checkpoint's tensors (meta ones will do, `trainer.models.meta_weights`),
    checked against the model as they would be loaded."""
    import torch

    from trainer.models import ModelSpecError, build_model, forward_sample

    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):  # parameters are counted as weights
            saved[id(t)] = t.numel() * t.element_size()
        return t

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(spec, input_shape, num_classes, weights=weights)
        sample = torch.zeros((1, *input_shape), dtype=torch.long if integer_input else None)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = forward_sample(model.train(), sample)
        except RuntimeError as exc:
            raise ModelSpecError(
                f"the model does not fit inputs of shape {input_shape}: {exc}"
            ) from None
    params = list(model.parameters())
    return Footprint(
        parameters=sum(p.numel() for p in params),
        trainable=sum(p.numel() for p in params if p.requires_grad),
        state_bytes=4 * sum(t.numel() for t in model.state_dict().values()),
        # the logits and their gradient too: with a large vocabulary they dominate
        activation_bytes=sum(saved.values()) + 2 * out.numel() * 4,
    )
