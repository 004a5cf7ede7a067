"""A task's step count and its training seed: pure arithmetic, no torch, so the marketplace's
web process can size and seed tasks (it imports no torch, issue 36) by the same rule the
trainer and the simulator use (trainer.local re-exports both)."""

from __future__ import annotations

import math

from trainer.spec import JobSpec


def derive_seed(seed: int, round_: int, node: int) -> int:
    """A task's training seed: independent, reproducible streams per (job seed, round, node or
    shard), the same in the simulator and on the marketplace; resuming never replays one."""
    return (seed * 1_000_003 + round_ * 10_007 + node * 101 + 17) % (2**63)


def planned_steps(spec: JobSpec, num_samples: int, batch_size: int | None = None) -> int:
    batch = batch_size or spec.local.batch_size
    if spec.local.steps is not None:
        return spec.local.steps
    return max(1, math.ceil(spec.local.epochs * num_samples / batch))  # type: ignore[operator]
