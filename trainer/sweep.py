"""Driving a hyperparameter sweep with Optuna: TPE sampling, median pruning.

The trials live elsewhere (the marketplace keeps them as rows, the bench in a list); each
decision rebuilds an in-memory Optuna study from them (`optuna.trial.create_trial` +
`study.add_trial`) and asks it one thing: the next trial's parameters, or whether a running
trial is to be pruned. No Optuna storage is kept anywhere, so the rows are the one record,
and a sampler seeded by the sweep's seed and the trial's number makes every decision
reproducible from them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from trainer.spec import JobSpec, parse_spec
from trainer.sweep_space import ParamRange, SweepSpec, apply_params, encode_choice

optuna.logging.set_verbosity(logging.WARNING)

# a trial's state, as the marketplace stores it
RUNNING, COMPLETED, PRUNED, FAILED = "running", "completed", "pruned", "failed"
_STATES = {
    RUNNING: TrialState.RUNNING,
    COMPLETED: TrialState.COMPLETE,
    PRUNED: TrialState.PRUNED,
    FAILED: TrialState.FAIL,
}


@dataclass
class TrialRecord:
    number: int
    params: dict[str, Any]
    state: str = RUNNING
    # round number -> the objective's per-round value (intermediate_value)
    intermediate: dict[int, float] = field(default_factory=dict)
    value: float | None = None


def distributions(sweep: SweepSpec) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for name, param in sweep.space.items():
        if isinstance(param, ParamRange):
            if param.integer:
                step = int(param.step or 1)
                out[name] = IntDistribution(int(param.low), int(param.high), log=param.log,
                                            step=step)  # fmt: skip
            else:
                out[name] = FloatDistribution(float(param.low), float(param.high),
                                              log=param.log, step=param.step)  # fmt: skip
        else:
            out[name] = CategoricalDistribution([encode_choice(c) for c in param])
    return out


def _sampler(sweep: SweepSpec, seed: int) -> optuna.samplers.BaseSampler:
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=sweep.startup_trials)


def _pruner(sweep: SweepSpec) -> optuna.pruners.BasePruner:
    if sweep.pruner == "none":
        return optuna.pruners.NopPruner()
    # Optuna's steps are our round numbers, from 1; it compares from step n_warmup_steps on,
    # and no trial is to be pruned within its first warmup_rounds rounds
    return optuna.pruners.MedianPruner(
        n_startup_trials=sweep.startup_trials, n_warmup_steps=sweep.warmup_rounds + 1
    )


def build_study(sweep: SweepSpec, records: list[TrialRecord], seed: int) -> optuna.Study:
    """An in-memory study holding `records` (in their numbers' order), sampling with `seed`."""
    dists = distributions(sweep)
    study = optuna.create_study(
        direction=sweep.direction, sampler=_sampler(sweep, seed), pruner=_pruner(sweep)
    )
    for rec in sorted(records, key=lambda r: r.number):
        state = _STATES[rec.state]
        done = state == TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                params={k: rec.params[k] for k in dists if k in rec.params},
                distributions={k: d for k, d in dists.items() if k in rec.params},
                value=rec.value if done else None,
                intermediate_values={int(k): float(v) for k, v in rec.intermediate.items()},
            )
        )
    return study


def ask(sweep: SweepSpec, records: list[TrialRecord], seed: int) -> dict[str, Any]:
    """The next trial's parameters, TPE (or random) sampled from the trials so far. The
    sampler's seed is the sweep's seed plus the new trial's number: the same history gives
    the same parameters, and trials asked at the same time still differ."""
    number = len(records)
    study = build_study(sweep, records, seed + number)
    trial = study.ask(distributions(sweep))
    return dict(trial.params)


def should_prune(sweep: SweepSpec, records: list[TrialRecord], number: int) -> bool:
    """Whether the median pruner stops trial `number` at its latest reported round."""
    study = build_study(sweep, records, 0)
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    if frozen.state != TrialState.RUNNING or not frozen.intermediate_values:
        return False
    return bool(study.pruner.prune(study, frozen))


def round_value(sweep: SweepSpec, metrics: dict[str, Any]) -> float | None:
    """A round's intermediate value, in the study's direction: the held-out error rate for
    rounds_to_target (the pruner compares trials round by round on it), the accuracy or the
    loss for those objectives. None when the round has no such metric."""
    key = "loss" if sweep.objective == "loss" else "accuracy"
    value = metrics.get(key)
    if not isinstance(value, int | float):
        return None
    return 1.0 - float(value) if sweep.objective == "rounds_to_target" else float(value)


def final_value(
    sweep: SweepSpec, *, rounds_done: int, reached_target: bool, max_rounds: int,
    last_metrics: dict[str, Any],
) -> float | None:  # fmt: skip
    """A finished trial's objective: rounds to the target (max_rounds + 1 if never reached,
    so that TPE still learns from it), else the last round's metric."""
    if sweep.objective == "rounds_to_target":
        return float(rounds_done if reached_target else max_rounds + 1)
    return round_value(sweep, last_metrics)


def best(sweep: SweepSpec, records: list[TrialRecord]) -> TrialRecord | None:
    """The completed trial with the best value (the lowest number among equals)."""
    done = [r for r in records if r.state == COMPLETED and r.value is not None]
    if not done:
        return None
    sign = -1.0 if sweep.direction == "maximize" else 1.0
    return min(done, key=lambda r: (sign * float(r.value or 0.0), r.number))


def trial_spec(spec: JobSpec, params: dict[str, Any], number: int) -> JobSpec:
    """Trial `number`'s training spec: the sweep's own with `params` written in."""
    data = apply_params(spec.trial_base(), params)
    data["name"] = f"{spec.name} #{number}"[:200]
    return parse_spec(data)
