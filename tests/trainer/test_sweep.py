"""kind: sweep: the spec's checks, and the Optuna driver (trainer.sweep) on made-up trials."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from trainer import sweep as study
from trainer.spec import SpecError, parse_spec

BASE: dict[str, Any] = {
    "name": "digits-sweep",
    "kind": "sweep",
    "dataset": {"kind": "digits"},
    "model": {"arch": "mlp", "hidden": [128]},
    "optimizer": {"name": "sgd", "lr": 0.2},
    "local": {"epochs": 1, "batch_size": 32},
    "rounds": {"max_rounds": 30, "target": {"metric": "accuracy", "value": 0.95}},
    "sweep": {
        "trials": 8,
        "parallel": 2,
        "startup_trials": 2,
        "space": {
            "lr": {"low": 0.01, "high": 1.0, "log": True},
            "batch_size": [16, 32, 64],
            "local_steps": {"low": 2, "high": 20},
            "width": [64, 128, 256],
        },
    },
}


def _spec(**sweep: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["sweep"] |= sweep
    return parse_spec(data)


def _problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    return err.value.problems


def test_a_sweep_spec_parses_and_its_trials_inherit_the_base() -> None:
    spec = _spec()
    params = {"lr": 0.05, "batch_size": 64, "local_steps": 7, "width": 256}
    trial = study.trial_spec(spec, params, 3)
    assert trial.kind == "train" and trial.sweep is None and trial.name == "digits-sweep #3"
    assert trial.optimizer.lr == 0.05 and trial.local.batch_size == 64
    assert trial.local.steps == 7 and trial.local.epochs is None  # steps replace epochs
    assert trial.model.hidden == [256]
    assert trial.rounds.target is not None and trial.rounds.target.value == 0.95
    assert "sweep" not in parse_spec(trial.to_dict()).to_dict()


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"sweep": None}, "<root>", "kind: sweep"),
        ({"kind": "train"}, "<root>", "only with it"),
        ({"sweep": {"space": {"colour": [1]}}}, "sweep.space", "'colour' is not a parameter"),
        ({"sweep": {"space": {"lr": {"low": 1.0, "high": 0.1}}}}, "sweep.space.lr", "exceed"),
        ({"sweep": {"space": {"lr": {"low": 0, "high": 1, "log": True}}}}, "sweep.space.lr",
         "low > 0"),
        ({"sweep": {"space": {"local_steps": {"low": 0, "high": 4}}}},
         "sweep.space.local_steps", "local.steps"),
        ({"sweep": {"space": {"batch_size": [16, 0]}}}, "sweep.space.batch_size",
         "local.batch_size"),
        ({"sweep": {"space": {"lr": [0.1]}, "trials": 0}}, "sweep.trials", "greater than"),
        ({"sweep": {"space": {"lr": [0.1]}, "objective": "accuracy", "target": 0.9}},
         "sweep", "rounds_to_target"),
        ({"sweep": {"space": {"lr": [0.1]}, "pruner": "hyperband"}}, "sweep.pruner", "median"),
    ],
)  # fmt: skip
def test_bad_sweeps_are_refused_naming_the_field(change, field, words) -> None:
    data = copy.deepcopy(BASE) | change
    problems = _problems(data)
    assert any(path.startswith(field) and words in reason for path, reason in problems), problems


def test_rounds_to_target_needs_a_target() -> None:
    data = copy.deepcopy(BASE)
    data["rounds"] = {"max_rounds": 10}
    assert any("needs a target" in r for _, r in _problems(data))
    data["sweep"]["target"] = 0.9
    assert parse_spec(data).trial_base()["rounds"]["target"]["value"] == 0.9


def test_asking_is_deterministic_and_parallel_asks_differ() -> None:
    spec = _spec().sweep
    first = study.ask(spec, [], seed=0)
    assert first == study.ask(spec, [], seed=0)
    second = study.ask(spec, [study.TrialRecord(0, first)], seed=0)
    assert second != first
    assert set(first) == {"lr", "batch_size", "local_steps", "width"}
    assert 0.01 <= first["lr"] <= 1.0 and first["batch_size"] in (16, 32, 64)
    assert isinstance(first["local_steps"], int) and 2 <= first["local_steps"] <= 20


def test_tpe_samples_near_the_best_completed_trials() -> None:
    """After the startup trials, TPE proposes learning rates near those that did well: here
    the fewest rounds at lr 0.3. A random sampler lands within a factor 4 of it 40% of the
    time (log-uniform over 0.001..1)."""
    spec = _spec(space={"lr": {"low": 0.001, "high": 1.0, "log": True}}, startup_trials=4).sweep
    records = []
    for n in range(20):
        lr = 10 ** (-3 + 3 * n / 19)
        value = 5.0 + 10 * abs(math.log10(lr / 0.3))
        records.append(study.TrialRecord(n, {"lr": lr}, study.COMPLETED, {}, value))
    asked = [study.ask(spec, records, seed=s)["lr"] for s in range(10)]
    near = [a for a in asked if 0.3 / 4 < a < 0.3 * 4]
    assert len(near) >= 8, asked


def _running(n: int, errors: list[float], state: str = study.RUNNING, value=None):
    return study.TrialRecord(n, {"lr": 0.1}, state, dict(enumerate(errors, 1)), value)


def test_the_median_pruner_stops_a_trial_worse_than_the_median_at_its_round() -> None:
    spec = _spec(space={"lr": [0.1]}, startup_trials=2, warmup_rounds=1).sweep
    done = [
        _running(0, [0.5, 0.3, 0.1], study.COMPLETED, 3.0),
        _running(1, [0.4, 0.2, 0.05], study.COMPLETED, 3.0),
    ]
    bad, good = _running(2, [0.9, 0.8]), _running(3, [0.3, 0.1])
    records = [*done, bad, good]
    assert study.should_prune(spec, records, 2)
    assert not study.should_prune(spec, records, 3)
    # within the warmup rounds nobody is pruned, nor before startup_trials completed
    assert not study.should_prune(spec, [*done, _running(2, [0.9])], 2)
    assert not study.should_prune(spec, [done[0], bad], 1)
    # pruner: none never prunes
    none = _spec(space={"lr": [0.1]}, pruner="none").sweep
    assert not study.should_prune(none, records, 2)


def test_values_and_the_best_trial() -> None:
    spec = _spec().sweep
    assert study.round_value(spec, {"accuracy": 0.9}) == pytest.approx(0.1)
    assert study.round_value(spec, {}) is None
    reached = study.final_value(spec, rounds_done=7, reached_target=True, max_rounds=30,
                                last_metrics={})  # fmt: skip
    missed = study.final_value(spec, rounds_done=30, reached_target=False, max_rounds=30,
                               last_metrics={})  # fmt: skip
    assert (reached, missed) == (7.0, 31.0)
    records = [
        _running(0, [], study.COMPLETED, 9.0),
        _running(1, [], study.PRUNED),
        _running(2, [], study.COMPLETED, 7.0),
        _running(3, [], study.COMPLETED, 7.0),
    ]
    best = study.best(spec, records)
    assert best is not None and best.number == 2
    acc = _spec(objective="accuracy", space={"lr": [0.1]}).sweep
    assert acc.direction == "maximize"
    assert study.best(acc, records).number == 0  # type: ignore[union-attr]


def test_the_simulator_refuses_a_sweep_saying_where_it_runs(capsys) -> None:
    from pathlib import Path

    from trainer.sim.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "digits-sweep.yaml"
    assert main(["run", str(example)]) == 2
    assert "kind: sweep" in capsys.readouterr().err
