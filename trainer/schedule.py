"""Learning-rate schedules over rounds and early stopping on a plateau.

The simulator, the marketplace's round lifecycle and the contributor's task runner all read
a round's learning rate and the stop rule from here, so a job trains the same everywhere.

The schedule steps over rounds, not over a node's local steps: every task of round r trains
at `round_lr(spec, r)`, constant through its local steps. Replicas of a unit then train
identically (verification compares them), a node's task stays one optimizer run that pauses
and resumes exactly, and the schedule does not depend on how many steps the adaptation policy
gives each node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainer.spec import EarlyStoppingSpec, JobSpec


def round_lr(spec: JobSpec, round_: int) -> float:
    """The learning rate of round `round_` (1-based) of a job of `rounds.max_rounds` rounds.

    Linear warmup from lr / (warmup_rounds + 1) up to lr over the first `warmup_rounds`
    rounds, then `cosine` decays from lr to lr x min_lr_fraction at the last round, and
    `step` multiplies by gamma every `step_rounds` rounds after the warmup."""
    sched = spec.optimizer.schedule
    base = spec.optimizer.lr
    r = max(1, round_)
    warm = sched.warmup_rounds
    if r <= warm:
        return base * r / (warm + 1)
    after = r - warm - 1  # rounds since the warmup ended (0 at the first full-lr round)
    if sched.kind == "cosine":
        span = max(1, spec.rounds.max_rounds - warm - 1)
        floor = base * sched.min_lr_fraction
        return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * min(after, span) / span))
    if sched.kind == "step":
        return base * sched.gamma ** (after // sched.step_rounds)
    return base


def plateau_reason(values: Sequence[float], rule: EarlyStoppingSpec | None) -> str:
    """Why a job stops early after the rounds whose held-out `rule.metric` is `values` (in
    round order), or "" while it goes on: the last `patience` rounds each failed to improve
    on the best round before them by more than `min_delta`."""
    if rule is None or len(values) <= rule.patience:
        return ""
    higher = rule.metric == "accuracy"
    best_i = 0
    for i, v in enumerate(values):
        gain = (v - values[best_i]) if higher else (values[best_i] - v)
        if i and gain > rule.min_delta:
            best_i = i
    stale = len(values) - 1 - best_i
    if stale < rule.patience:
        return ""
    return (
        f"early stopping: {rule.metric} did not improve by more than {rule.min_delta:g} for "
        f"{stale} rounds (best {values[best_i]:.4f} at round {best_i + 1}; patience "
        f"{rule.patience})"
    )
