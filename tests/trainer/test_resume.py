"""A paused local run resumes to exactly the update an unpaused run makes (trainer.resume)."""

import pytest
import torch

from trainer.datasets import load_dataset
from trainer.local import _can_autocast, train_local
from trainer.models import build_model
from trainer.resume import PausedState, ResumeError, TrainingPaused
from trainer.spec import parse_spec

STEPS = 12


@pytest.fixture(scope="module")
def digits():
    return load_dataset(parse_spec({"name": "t"}).dataset)


def _run(digits, spec, *, seed=3, pause_at=None, resume=None, proximal_mu=0.0):
    model = build_model(spec.model, digits.input_shape, digits.num_classes, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    asked = []

    def pause() -> bool:
        asked.append(1)
        return pause_at is not None and len(asked) > pause_at

    shard = digits.subset(torch.arange(150))
    return train_local(model, state, shard, spec, seed=seed, pause=pause, resume=resume,
                       proximal_mu=proximal_mu)  # fmt: skip


def _paused(digits, spec, at, **kw) -> PausedState:
    with pytest.raises(TrainingPaused) as caught:
        _run(digits, spec, pause_at=at, **kw)
    # through bytes, as the runner keeps it on disk between the pause and the resume
    return PausedState.from_bytes(caught.value.state.to_bytes())


PRECISIONS = ["fp32"] + (["bf16"] if _can_autocast("cpu", torch.bfloat16) else [])


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_resumed_run_ends_exactly_where_an_unpaused_one_does(digits, optimizer, precision):
    spec = parse_spec({
        "name": "t",
        "model": {"arch": "mlp", "hidden": [32], "dropout": 0.2},  # dropout: the RNG matters
        "optimizer": {"name": optimizer, "lr": 0.05, "momentum": 0.9 if optimizer == "sgd" else 0},
        "local": {"steps": STEPS, "batch_size": 16, "grad_accum_steps": 2,
                  "precision": precision},
    })  # fmt: skip
    whole = _run(digits, spec, proximal_mu=0.1)
    paused = _paused(digits, spec, 5, proximal_mu=0.1)
    assert paused.step == 5
    resumed = _run(digits, spec, resume=paused, proximal_mu=0.1)
    assert resumed.steps == whole.steps == STEPS
    assert resumed.loss == whole.loss
    for key, delta in whole.delta.items():
        assert torch.equal(resumed.delta[key], delta), key


def test_a_run_paused_twice_still_ends_the_same(digits) -> None:
    spec = parse_spec({"name": "t", "optimizer": {"name": "adam", "lr": 0.01},
                       "local": {"steps": STEPS, "batch_size": 16}})  # fmt: skip
    whole = _run(digits, spec)
    first = _paused(digits, spec, 3)
    with pytest.raises(TrainingPaused) as caught:
        _run(digits, spec, resume=first, pause_at=4)  # four more steps, then paused again
    second = caught.value.state
    assert second.step == 7
    resumed = _run(digits, spec, resume=second)
    assert all(torch.equal(resumed.delta[k], whole.delta[k]) for k in whole.delta)
    assert resumed.compute_s >= second.meta["compute_s"] >= first.meta["compute_s"] > 0


def test_a_paused_state_from_another_run_is_refused(digits) -> None:
    spec = parse_spec({"name": "t", "local": {"steps": STEPS, "batch_size": 16}})
    paused = _paused(digits, spec, 4)
    with pytest.raises(ResumeError, match="another run"):
        _run(digits, spec, seed=4, resume=paused)  # another seed: other batches


@pytest.mark.parametrize("damage", [b"", b"not safetensors", b"\x08" + b"\x00" * 7 + b"{}"])
def test_a_damaged_paused_state_is_refused_with_a_reason(damage) -> None:
    with pytest.raises(ResumeError, match=r"cannot be read|not a GPUFlex"):
        PausedState.from_bytes(damage)
