"""Segment checks of a proof of learning (trainer.proof, trainer.proof_commitment)."""

import itertools

import pytest
import torch

from trainer.datasets import load_dataset
from trainer.local import _can_autocast, train_local
from trainer.models import build_model
from trainer.proof import (
    boundaries,
    check_binding,
    check_segment,
    tolerance_for,
)
from trainer.proof_commitment import CommitmentError, commitment, parse_claim
from trainer.replicas import SAME_DEVICE_TOLERANCE
from trainer.resume import PausedState
from trainer.spec import parse_spec

STEPS = 16


@pytest.fixture(scope="module")
def digits():
    return load_dataset(parse_spec({"name": "t"}).dataset)


def _spec(precision="fp32", optimizer="adam"):
    return parse_spec({
        "name": "t",
        "model": {"arch": "mlp", "hidden": [32], "dropout": 0.2},
        "optimizer": {"name": optimizer, "lr": 0.02, "momentum": 0.9 if optimizer == "sgd" else 0},
        "local": {"steps": STEPS, "batch_size": 16, "precision": precision},
    })  # fmt: skip


def _model(digits, spec):
    return build_model(spec.model, digits.input_shape, digits.num_classes, seed=0)


def _chain(digits, spec, *, steps=STEPS, seed=3, shard=None):
    """A task's run with its boundary checkpoints, through bytes as the runner keeps them."""
    model = _model(digits, spec)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    shard = shard if shard is not None else digits.subset(torch.arange(200))
    kept: list[bytes] = []
    result = train_local(model, state, shard, spec, seed=seed, steps=steps,
                         checkpoints=boundaries(steps), on_checkpoint=lambda s: kept.append(
                             s.to_bytes()))  # fmt: skip
    return state, shard, result, kept


def test_boundaries_split_a_task_evenly() -> None:
    assert boundaries(16) == [0, 4, 8, 12, 16]
    assert boundaries(10) == [0, 2, 5, 8, 10]
    assert boundaries(2) == [0, 1, 2]
    with pytest.raises(ValueError):
        boundaries(0)


def test_checkpoints_do_not_change_the_update(digits) -> None:
    spec = _spec()
    _, _, with_ckpt, kept = _chain(digits, spec)
    model = _model(digits, spec)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    plain = train_local(model, state, digits.subset(torch.arange(200)), spec, seed=3, steps=STEPS)
    assert [PausedState.from_bytes(b).step for b in kept] == boundaries(STEPS)
    assert all(torch.equal(plain.delta[k], with_ckpt.delta[k]) for k in plain.delta)


def test_commitment_is_over_the_state_not_its_timing(digits) -> None:
    _, _, _, kept = _chain(digits, _spec())
    _, _, _, again = _chain(digits, _spec())
    assert [commitment(b) for b in kept] == [commitment(b) for b in again]
    state = PausedState.from_bytes(kept[1])
    state.meta["compute_s"] = 123.0
    assert commitment(state.to_bytes()) == commitment(kept[1])
    state.tensors["model/net.0.weight"][0, 0] += 1e-6
    assert commitment(state.to_bytes()) != commitment(kept[1])
    assert len({commitment(b) for b in kept}) == len(kept)
    with pytest.raises(CommitmentError):
        commitment(b"not a checkpoint at all")


def test_claims_are_checked() -> None:
    c = ["a" * 64] * 3
    assert parse_claim(c, [0, 2, 4], 4) == (c, [0, 2, 4])
    for commitments, bounds in ((c, [0, 2, 3]), (c[:2], [0, 2, 4]), (c, [0, 2, 2]),
                                (["x"] * 3, [0, 2, 4]), (c, [1, 2, 4])):  # fmt: skip
        with pytest.raises(CommitmentError):
            parse_claim(commitments, bounds, 4)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_honest_segment_rerun_on_the_same_device_is_exact(digits, optimizer) -> None:
    spec = _spec(optimizer=optimizer)
    _, shard, _, kept = _chain(digits, spec)
    states = [PausedState.from_bytes(b) for b in kept]
    for start, end in itertools.pairwise(states):
        verdict = check_segment(
            _model(digits, spec),
            start,
            end,
            shard,
            spec,
            seed=3,
            steps=STEPS,
            tolerance=tolerance_for("fp32", "fp32", True, SAME_DEVICE_TOLERANCE),
        )
        assert verdict.ok and verdict.distance.relative_l2 == 0.0
        assert verdict.steps == end.step - start.step


def test_half_the_steps_fails_the_segment(digits) -> None:
    """A node that trains half the steps and states its half-run's boundaries as the task's."""
    spec = _spec()
    _, shard, _, lazy = _chain(digits, spec, steps=STEPS // 2)
    states = [PausedState.from_bytes(b) for b in lazy]
    for j, (start, end) in enumerate(itertools.pairwise(states)):
        claimed = boundaries(STEPS)
        start = PausedState(claimed[j], start.tensors, start.meta)
        end = PausedState(claimed[j + 1], end.tensors, end.meta)
        verdict = check_segment(
            _model(digits, spec),
            start,
            end,
            shard,
            spec,
            seed=3,
            steps=STEPS,
            tolerance=tolerance_for("fp32", "bf16", False),
        )
        assert not verdict.ok, (j, verdict.distance.relative_l2)


def test_another_shards_segment_fails(digits) -> None:
    spec = _spec()
    _, _, _, kept = _chain(digits, spec, shard=digits.subset(torch.arange(200, 400)))
    states = [PausedState.from_bytes(b) for b in kept]
    verdict = check_segment(_model(digits, spec), states[1], states[2],
                            digits.subset(torch.arange(200)), spec, seed=3, steps=STEPS,
                            tolerance=tolerance_for("fp32", "bf16", False))  # fmt: skip
    assert not verdict.ok


@pytest.mark.skipif(not _can_autocast("cpu", torch.bfloat16), reason="no CPU bf16 autocast")
def test_a_bf16_segment_rerun_in_fp32_passes_the_cross_precision_rule(digits) -> None:
    _, shard, _, kept = _chain(digits, _spec("bf16"))
    states = [PausedState.from_bytes(b) for b in kept]
    verdict = check_segment(
        _model(digits, _spec()),
        states[2],
        states[3],
        shard,
        _spec(),
        seed=3,
        steps=STEPS,
        tolerance=tolerance_for("bf16", "fp32", False),
    )
    assert verdict.ok and verdict.precision == "fp32"
    assert 0 < verdict.distance.relative_l2 < 0.25


def test_the_chain_is_bound_to_the_model_and_the_update(digits) -> None:
    spec = _spec()
    state, _, result, kept = _chain(digits, spec)
    first, last = PausedState.from_bytes(kept[0]), PausedState.from_bytes(kept[-1])
    assert check_binding(first, last, state, result.delta) is None
    scaled = {k: v * 2 for k, v in result.delta.items()}
    assert "uploaded update" in check_binding(first, last, state, scaled)
    other = {k: v + 0.01 for k, v in state.items()}
    assert "round's model" in check_binding(first, None, other, result.delta)


def test_the_tolerance_follows_the_replica_policy() -> None:
    assert tolerance_for("fp32", "fp32", True) == 0.25  # default: CPUs of other makes differ
    assert tolerance_for("fp32", "fp32", True, SAME_DEVICE_TOLERANCE) == SAME_DEVICE_TOLERANCE
    assert tolerance_for("fp32", "fp32", False, SAME_DEVICE_TOLERANCE) == 0.25
    assert tolerance_for("bf16", "fp32", True, SAME_DEVICE_TOLERANCE) == 0.25
