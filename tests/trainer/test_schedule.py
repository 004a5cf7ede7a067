"""Learning-rate schedules over rounds and early stopping on a plateau (trainer.schedule)."""

import itertools
from pathlib import Path

import pytest
import torch

import trainer.sim.federated as federated
from trainer.datasets import load_dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.schedule import plateau_reason, round_lr
from trainer.sim.federated import RunOptions, run_federated
from trainer.sim.setup import prepare
from trainer.spec import EarlyStoppingSpec, SpecError, load_spec, parse_spec

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.yaml"


def _spec(schedule: dict, max_rounds: int = 10, lr: float = 0.1):
    return parse_spec({"name": "s", "optimizer": {"lr": lr, "schedule": schedule},
                       "rounds": {"max_rounds": max_rounds}})  # fmt: skip


def test_cosine_with_warmup_rises_linearly_then_decays_to_the_floor() -> None:
    spec = _spec({"kind": "cosine", "warmup_rounds": 3, "min_lr_fraction": 0.1}, max_rounds=10)
    lrs = [round_lr(spec, r) for r in range(1, 11)]
    assert lrs[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])  # warmup, then the peak
    assert lrs[-1] == pytest.approx(0.01)  # the floor at the last round
    assert all(a > b for a, b in itertools.pairwise(lrs[3:]))  # strictly decaying


def test_step_schedule_multiplies_by_gamma_every_step_rounds() -> None:
    spec = _spec({"kind": "step", "warmup_rounds": 1, "step_rounds": 2, "gamma": 0.5})
    lrs = [round_lr(spec, r) for r in range(1, 8)]
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025])


def test_constant_is_the_default_and_keeps_the_spec_lr() -> None:
    spec = parse_spec({"name": "s"})
    assert spec.optimizer.schedule.kind == "constant"
    assert spec.rounds.early_stopping is None
    assert {round_lr(spec, r) for r in range(1, 60)} == {spec.optimizer.lr}


def test_bad_schedule_and_early_stopping_fields_are_named() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "s", "optimizer": {"schedule": {"kind": "linear", "gamma": 2}},
                    "rounds": {"early_stopping": {"patience": 0, "min_delta": -1}}})  # fmt: skip
    paths = {p for p, _ in err.value.problems}
    assert paths == {
        "optimizer.schedule.kind",
        "optimizer.schedule.gamma",
        "rounds.early_stopping.patience",
        "rounds.early_stopping.min_delta",
    }


def test_plateau_counts_rounds_since_the_last_real_improvement() -> None:
    rule = EarlyStoppingSpec(metric="accuracy", patience=2, min_delta=0.01)
    assert plateau_reason([0.5, 0.6], rule) == ""
    # 0.605 and 0.609 improve on 0.6 by less than min_delta: two stale rounds
    reason = plateau_reason([0.5, 0.6, 0.605, 0.609], rule)
    assert "accuracy did not improve by more than 0.01 for 2 rounds" in reason
    assert "best 0.6000 at round 2" in reason
    assert plateau_reason([0.5, 0.6, 0.605, 0.62], rule) == ""  # 0.62 improves by 0.02
    loss = EarlyStoppingSpec(metric="loss", patience=1, min_delta=0.0)
    assert plateau_reason([1.0, 0.8], loss) == ""
    assert "loss did not improve" in plateau_reason([1.0, 0.8, 0.8], loss)
    assert plateau_reason([1.0, 1.0, 1.0], None) == ""


def test_train_local_lr_is_the_rate_the_optimizer_runs_at() -> None:
    spec = parse_spec({"name": "s", "local": {"steps": 3}, "optimizer": {"lr": 0.1}})
    data = load_dataset(spec.dataset, seed=0)
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    given = train_local(model, start, data, spec, seed=1, lr=0.03)
    same = train_local(model, start, data, spec.replace(optimizer={"lr": 0.03}), seed=1)
    default = train_local(model, start, data, spec, seed=1)
    for k in given.delta:
        assert torch.equal(given.delta[k], same.delta[k])
    assert any(not torch.equal(given.delta[k], default.delta[k]) for k in given.delta)


def test_simulator_trains_each_round_at_its_scheduled_rate_and_stops_on_a_plateau(
    monkeypatch,
) -> None:
    spec = load_spec(DIGITS).replace(
        optimizer={"lr": 0.2, "schedule": {"kind": "cosine", "warmup_rounds": 1}},
        # no round can improve accuracy by more than 1: the plateau ends the run after
        # round 1 + patience, long before max_rounds
        rounds={"max_rounds": 20, "early_stopping": {"patience": 2, "min_delta": 1.0}},
    )
    seen: list[float] = []
    real = federated.train_local

    def recording(*args, **kwargs):
        seen.append(kwargs["lr"])
        return real(*args, **kwargs)

    monkeypatch.setattr(federated, "train_local", recording)
    result, _ = run_federated(prepare(spec, 2, "lan", 0), RunOptions(stop_at_target=False))
    assert result.rounds == 3
    assert "early stopping: accuracy did not improve by more than 1 for 2 rounds" in (
        result.stop_reason
    )
    assert seen == pytest.approx([round_lr(spec, r) for r in (1, 1, 2, 2, 3, 3)])
    assert seen[0] == pytest.approx(0.1)  # half the rate in the one warmup round
