"""Differential privacy: CSPRNG noise on the node, the noise check, Opacus's accountant and
DP-SGD (trainer/privacy.py, trainer/dp_sgd.py)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.datasets import load_dataset
from trainer.dp_sgd import DPUnsupported, check_model
from trainer.local import train_local
from trainer.models import build_model
from trainer.privacy import (
    clip_update,
    csprng_normal,
    epsilon_after,
    noise_for_budget,
    noise_problem,
    privatize_update,
    round_plan,
    rounds_within,
    update_norm,
)
from trainer.spec import SpecError, parse_spec


def _spec(**privacy):
    return parse_spec({"name": "t", "local": {"steps": 10, "batch_size": 16}, "privacy": privacy})


def _delta(d: int = 20_000, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(d - 100, generator=g) * scale, "b": torch.randn(100, generator=g)}


def test_csprng_noise_is_standard_normal_and_never_repeats() -> None:
    z = csprng_normal((200_000,), torch.float64)
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1.0) < 0.02
    # about 4.55 % of a normal lies beyond 2 sigma
    assert float((z.abs() > 2).double().mean()) == pytest.approx(0.0455, abs=0.003)
    assert not torch.equal(csprng_normal((64,), torch.float32), csprng_normal((64,), torch.float32))


def test_an_update_is_clipped_then_noised_and_passes_the_check() -> None:
    privacy = _spec(clip_norm=1.0, noise_multiplier=0.01).privacy
    delta = _delta()
    noisy = privatize_update(delta, privacy)
    assert noise_problem(noisy, privacy) is None
    clipped = clip_update(delta, 1.0)
    assert update_norm(clipped) == pytest.approx(1.0)
    # two runs on the same update draw different noise: no seed the server could know
    again = privatize_update(delta, privacy)
    assert not torch.equal(noisy["w"], again["w"])


def test_the_check_catches_missing_shrunk_and_unclipped_noise() -> None:
    privacy = _spec(clip_norm=1.0, noise_multiplier=1.0).privacy
    delta = _delta()
    sigma = 1.0
    clipped = clip_update(delta, 1.0)
    assert "less noise" in noise_problem(clipped, privacy)  # no noise at all
    shrunk = {k: t + csprng_normal(t.shape, t.dtype) * sigma * 0.8 for k, t in clipped.items()}
    assert "less noise" in noise_problem(shrunk, privacy)
    # the noise hides a clip skipped by a little; one skipped by far shows (docs/privacy.md)
    honest = {k: t + csprng_normal(t.shape, t.dtype) * sigma for k, t in clipped.items()}
    assert noise_problem(honest, privacy) is None
    unclipped = {k: t * 100 + csprng_normal(t.shape, t.dtype) * sigma for k, t in clipped.items()}
    assert "larger" in noise_problem(unclipped, privacy)


def test_the_accountant_spends_more_with_rounds_and_finds_the_noise_for_a_budget() -> None:
    spec = _spec(clip_norm=1.0, epsilon=8.0)
    plan = round_plan(spec, shard_rows=300, noise_multiplier=1.0)
    assert plan.sample_rate == 1.0 and plan.steps_per_round == 1
    spent = [epsilon_after(plan, r, 1e-5) for r in (1, 5, 20)]
    assert spent[0] < spent[1] < spent[2]
    z = noise_for_budget(plan, 20, epsilon=8.0, delta=1e-5)
    with_z = round_plan(spec, 300, z)
    assert 7.8 <= epsilon_after(with_z, 20, 1e-5) <= 8.0
    assert epsilon_after(with_z, 21, 1e-5) > 8.0
    assert rounds_within(with_z, 8.0, 1e-5, limit=100) == 20
    assert rounds_within(plan, 8.0, 1e-5, limit=100) < 20  # less noise: fewer rounds fit


def test_sample_level_plans_compose_every_local_step() -> None:
    spec = _spec(clip_norm=1.0, mode="sample", noise_multiplier=1.1)
    plan = round_plan(spec, shard_rows=320)
    assert plan.sample_rate == pytest.approx(16 / 320) and plan.steps_per_round == 10
    assert epsilon_after(plan, 10, 1e-5) < epsilon_after(round_plan(_spec(
        clip_norm=1.0, noise_multiplier=1.1), 320), 10, 1e-5)  # fmt: skip


def test_privacy_specs_name_what_is_missing() -> None:
    for bad in ({"epsilon": 2.0}, {"mode": "sample"}, {"noise_multiplier": 1.0}):
        with pytest.raises(SpecError) as info:
            _spec(**bad)
        assert "clip_norm" in str(info.value)
    assert not _spec(clip_norm=1.0).privacy.private
    assert _spec(clip_norm=1.0, epsilon=2.0).privacy.private


def test_dp_sgd_trains_with_opacus_and_clips_the_update() -> None:
    spec = _spec(clip_norm=0.5, mode="sample", noise_multiplier=0.5)
    data = load_dataset(spec.dataset).subset(torch.arange(300))
    model = build_model(spec.model, data.input_shape, data.num_classes, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_local(model, state, data, spec, seed=1)
    assert result.steps == 10 and math.isfinite(result.loss)
    assert 0 < update_norm(result.delta) <= 0.5 + 1e-6
    # Opacus's hooks are gone: the reused model trains as a plain one again
    plain = _spec()
    again = train_local(model, state, data, plain, seed=1)
    assert torch.equal(again.delta["net.0.weight"], train_local(
        model, state, data, plain, seed=1).delta["net.0.weight"])  # fmt: skip


def test_dp_sgd_refuses_models_it_cannot_train() -> None:
    with pytest.raises(DPUnsupported, match="BatchNorm"):
        check_model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
