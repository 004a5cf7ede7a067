"""An emulated GPU of a fixed speed, for benches and tests only (no contributor option).

A machine with two cores cannot give ten agents real compute. `--compute-scale` (the demo's
slower nodes) multiplies whatever a task's compute took, so on a loaded host the emulated
GPU slows with the host's contention: a bench then measures the machine, not the system.
With GPUFLEX_EMULATED_SAMPLE_S set in the agent's environment, a task's compute takes a time
fixed by its work instead: `sample_s` seconds per training sample (steps x batch x gradient
accumulation), the agent waiting out whatever real compute did not take. Real compute that
took longer than that is reported as it was (the emulation cannot make a host faster).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

SAMPLE_S_ENV = "GPUFLEX_EMULATED_SAMPLE_S"


class BadEmulation(ValueError):
    pass


def sample_s(env: Mapping[str, str] | None = None) -> float:
    """The emulated seconds per training sample (GPUFLEX_EMULATED_SAMPLE_S); 0: not emulated."""
    raw = (os.environ if env is None else env).get(SAMPLE_S_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise BadEmulation(f"{SAMPLE_S_ENV}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value >= 0):
        raise BadEmulation(f"{SAMPLE_S_ENV}={raw!r} must be a finite number of seconds >= 0")
    return value


def samples_trained(task: Mapping[str, Any], metrics: Mapping[str, Any]) -> int:
    """The samples a training task's steps went through: its reported steps x the task's
    batch size (the spec's when the task names none) x the spec's gradient accumulation."""
    local = ((task.get("spec") or {}).get("local")) or {}
    batch = task.get("batch_size") or local.get("batch_size") or 0
    accum = local.get("grad_accum_steps") or 1
    steps = metrics.get("steps") or 0
    return max(int(steps), 0) * max(int(batch), 0) * max(int(accum), 1)


def step_s(task: Mapping[str, Any], per_sample_s: float) -> float:
    """One optimizer step's emulated seconds for `task` (a continuation's steps are paced
    as they happen: it is stopped by time, not by its step count)."""
    return samples_trained(task, {"steps": 1}) * per_sample_s


def hold_s(real_compute_s: float, emulated_s: float) -> float:
    """How long the agent waits after a task whose compute took `real_compute_s` so that it
    took `emulated_s` in all; never negative."""
    return max(emulated_s - max(real_compute_s, 0.0), 0.0)
