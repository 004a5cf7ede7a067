import pytest
import torch

from trainer.datasets import load_dataset
from trainer.evaluate import Evaluation, evaluate
from trainer.local import planned_steps, train_local
from trainer.models import build_model
from trainer.spec import parse_spec


@pytest.fixture(scope="module")
def digits():
    return load_dataset(parse_spec({"name": "t"}).dataset)


def _spec(**sections):
    return parse_spec({"name": "t", "local": {"steps": 20, "batch_size": 16}, **sections})


def _setup(digits, spec):
    model = build_model(spec.model, digits.input_shape, digits.num_classes, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return model, state, digits.subset(torch.arange(200))


def test_local_training_returns_a_delta_that_lowers_the_loss(digits) -> None:
    spec = _spec()
    model, state, shard = _setup(digits, spec)
    result = train_local(model, state, shard, spec, seed=1)
    assert result.steps == 20 and result.num_samples == 200
    assert set(result.delta) == set(state)
    trained = {k: state[k] + result.delta[k] for k in state}
    model.load_state_dict(state)
    before = evaluate(model, digits).loss
    model.load_state_dict(trained)
    assert evaluate(model, digits).loss < before


def test_local_training_is_deterministic_for_a_seed(digits) -> None:
    spec = _spec()
    model, state, shard = _setup(digits, spec)
    a = train_local(model, state, shard, spec, seed=7)
    b = train_local(model, state, shard, spec, seed=7)
    c = train_local(model, state, shard, spec, seed=8)
    assert all(torch.equal(a.delta[k], b.delta[k]) for k in state)
    assert not all(torch.equal(a.delta[k], c.delta[k]) for k in state)


def test_epochs_translate_to_steps() -> None:
    spec = parse_spec({"name": "t", "local": {"epochs": 2, "batch_size": 32}})
    assert planned_steps(spec, 100) == 7  # ceil(2 * 100 / 32)


def test_fedprox_term_keeps_the_update_smaller(digits) -> None:
    spec = _spec(optimizer={"lr": 0.5})
    model, state, shard = _setup(digits, spec)
    plain = train_local(model, state, shard, spec, seed=1)
    prox = train_local(model, state, shard, spec, seed=1, proximal_mu=1.0)

    def norm(d):
        return torch.sqrt(sum((t**2).sum() for t in d.values()))

    assert norm(prox.delta) < norm(plain.delta)


def test_privacy_clips_the_update_norm(digits) -> None:
    spec = _spec(privacy={"clip_norm": 0.05})
    model, state, shard = _setup(digits, spec)
    delta = train_local(model, state, shard, spec, seed=1).delta
    norm = torch.sqrt(sum((t.double() ** 2).sum() for t in delta.values()))
    assert norm == pytest.approx(0.05, rel=1e-4)


def test_accuracy_targets_compare_exact_fractions() -> None:
    assert Evaluation(correct=342, total=360, loss=0.1).meets("accuracy", 0.95)
    assert not Evaluation(correct=341, total=360, loss=0.1).meets("accuracy", 0.95)
    assert Evaluation(correct=0, total=1, loss=0.2).meets("loss", 0.25)
