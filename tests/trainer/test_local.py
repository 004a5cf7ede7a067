import pytest
import torch

from trainer.datasets import IGNORE_INDEX, Dataset, load_dataset
from trainer.evaluate import Evaluation, evaluate
from trainer.local import _can_autocast, _schedule, planned_steps, resolve_precision, train_local
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


# --- precision, gradient accumulation, activation checkpointing -------------------------


def _delta_close(a, b, atol=1e-6):
    return all(torch.allclose(a.delta[k], b.delta[k], atol=atol, rtol=1e-4) for k in a.delta)


def _lowers_loss(model, state, result, data) -> bool:
    model.load_state_dict(state)
    before = evaluate(model, data).loss
    model.load_state_dict({k: state[k] + result.delta[k] for k in state})
    return evaluate(model, data).loss < before


def test_auto_precision_is_bf16_on_ampere_fp16_on_older_gpus_fp32_on_cpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)  # the rule for NVIDIA GPUs
    cuda = torch.device("cuda")
    assert resolve_precision("auto", cuda, capability=(8, 0)) == "bf16"
    assert resolve_precision("auto", cuda, capability=(9, 0)) == "bf16"
    assert resolve_precision("auto", cuda, capability=(7, 5)) == "fp16"
    assert resolve_precision("fp16", cuda, capability=(9, 0)) == "fp16"
    assert resolve_precision("fp32", cuda, capability=(9, 0)) == "fp32"
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("mps")) == "fp32"
    # without an explicit capability, the device's own is queried
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 1))
    assert resolve_precision("auto", cuda) == "fp16"


def test_precision_a_device_cannot_run_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ValueError, match=r"local\.precision 'bf16'.*7\.0"):
        resolve_precision("bf16", torch.device("cuda"), capability=(7, 0))
    with pytest.raises(ValueError, match=r"local\.precision"):
        resolve_precision("bf16", torch.device("meta"))  # no autocast at all
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"


def test_bf16_autocast_trains_on_cpu(digits) -> None:
    spec = _spec(local={"steps": 20, "batch_size": 16, "precision": "bf16"})
    model, state, shard = _setup(digits, spec)
    result = train_local(model, state, shard, spec, seed=1)
    assert result.precision == "bf16"
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in result.delta.values())
    assert _lowers_loss(model, state, result, digits)
    fp32 = train_local(model, state, shard, _spec(), seed=1)
    assert fp32.precision == "fp32"
    assert not _delta_close(result, fp32, atol=0)  # bf16 matmuls round differently: it did run
    assert _delta_close(result, fp32, atol=5e-3)  # ... and trained the same model


@pytest.mark.skipif(
    not _can_autocast("cpu", torch.float16), reason="this torch has no fp16 CPU autocast"
)
def test_fp16_with_loss_scaling_trains_on_cpu(digits) -> None:
    spec = _spec(local={"steps": 20, "batch_size": 16, "precision": "fp16"})
    model, state, shard = _setup(digits, spec)
    result = train_local(model, state, shard, spec, seed=1)
    assert result.precision == "fp16"
    assert all(torch.isfinite(t).all() for t in result.delta.values())
    assert _lowers_loss(model, state, result, digits)
    again = train_local(model, state, shard, spec, seed=1)
    assert all(torch.equal(result.delta[k], again.delta[k]) for k in state)


@pytest.mark.parametrize("accum", [2, 3, 16])
def test_gradient_accumulation_matches_the_whole_batch(digits, accum: int) -> None:
    # 200 samples in batches of 16: step 13 is the epoch's partial batch of 8 (< 16 micro-batches)
    whole = _spec(optimizer={"name": "adam", "lr": 0.01})
    split = _spec(
        optimizer={"name": "adam", "lr": 0.01},
        local={"steps": 20, "batch_size": 16, "grad_accum_steps": accum},
    )
    model, state, shard = _setup(digits, whole)
    a = train_local(model, state, shard, whole, seed=1, proximal_mu=0.5)
    b = train_local(model, state, shard, split, seed=1, proximal_mu=0.5)
    assert _delta_close(a, b, atol=1e-5)
    assert b.loss == pytest.approx(a.loss, rel=1e-5)  # prox term counted once per step


def test_gradient_accumulation_weights_language_model_tokens_not_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (24, 12), generator=gen)
    y = torch.randint(0, 256, (24, 12), generator=gen)
    lengths = torch.randint(2, 13, (24,), generator=gen)  # padding: uneven token counts
    y[torch.arange(12) >= lengths[:, None]] = IGNORE_INDEX
    data = Dataset(
        name="lm", task="language_model", x_train=x, y_train=y, x_test=x[:2], y_test=y[:2],
        num_classes=256, input_shape=(12,),
    )  # fmt: skip
    model_spec = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}
    whole = _spec(model=model_spec, local={"steps": 5, "batch_size": 8})
    split = _spec(model=model_spec, local={"steps": 5, "batch_size": 8, "grad_accum_steps": 4})
    model = build_model(whole.model, data.input_shape, 256, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    a = train_local(model, state, data, whole, seed=1)
    b = train_local(model, state, data, split, seed=1)
    assert _delta_close(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "model_spec",
    [
        {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2, "dropout": 0.2},
        {"arch": "resnet", "channels": [8, 16], "blocks": 2},
    ],
    ids=["transformer", "resnet"],
)
def test_activation_checkpointing_gives_the_same_update(digits, model_spec) -> None:
    if model_spec["arch"] == "transformer":
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (32, 16), generator=gen)
        data = Dataset(
            name="lm", task="language_model", x_train=x, y_train=x.roll(-1, 1), x_test=x[:2],
            y_test=x[:2], num_classes=256, input_shape=(16,),
        )  # fmt: skip
    else:
        data = digits.subset(torch.arange(64))
    plain = _spec(model=model_spec, local={"steps": 4, "batch_size": 8})
    ckpt = _spec(model={**model_spec, "checkpointing": True}, local={"steps": 4, "batch_size": 8})
    shape, classes = data.input_shape, data.num_classes
    models = [build_model(s.model, shape, classes, seed=0) for s in (plain, ckpt)]
    state = {k: v.clone() for k, v in models[0].state_dict().items()}
    a = train_local(models[0], state, data, plain, seed=1)
    b = train_local(models[1], state, data, ckpt, seed=1)
    assert _delta_close(a, b, atol=1e-6)
    assert any(t.abs().max() > 1e-4 for t in a.delta.values())  # it did train


def test_schedule_shuffles_whole_epochs_and_keeps_the_partial_batch() -> None:
    order, bounds = _schedule(10, 4, 5, torch.Generator().manual_seed(0))
    assert bounds == [0, 4, 8, 10, 14, 18]
    assert sorted(order[:10].tolist()) == list(range(10))  # epoch 1: every sample once
    assert len(set(order[10:18].tolist())) == 8  # epoch 2 has begun afresh


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _memcpys(fn) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return {kind: sum(kind in n for n in names) for kind in ("Memcpy HtoD", "Memcpy DtoH")}


@pytest.mark.gpu
@cuda
def test_gpu_training_uses_auto_mixed_precision_and_tf32(digits) -> None:
    device = torch.device("cuda")
    spec = _spec(optimizer={"name": "adamw", "lr": 0.01})
    model = build_model(spec.model, digits.input_shape, digits.num_classes, seed=0).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    shard = digits.subset(torch.arange(200))
    result = train_local(model, state, shard, spec, seed=1)
    assert result.precision == resolve_precision("auto", device)
    assert result.precision == ("bf16" if torch.cuda.is_bf16_supported(False) else "fp16")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert all(torch.isfinite(t).all() and t.device.type == "cpu" for t in result.delta.values())
    again = train_local(model, state, shard, spec, seed=1)
    assert all(torch.equal(result.delta[k], again.delta[k]) for k in state)
    model.cpu()
    assert _lowers_loss(model, {k: v.cpu() for k, v in state.items()}, result, digits)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_gpu_copies_data_once_and_never_syncs_per_step(digits, precision: str) -> None:
    device = torch.device("cuda")
    model = build_model(_spec().model, digits.input_shape, digits.num_classes, seed=0).to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def run(steps: int):
        spec = _spec(optimizer={"name": "adamw"}, local={"steps": steps, "precision": precision})
        return lambda: train_local(model, state, digits, spec, seed=1)

    run(2)()  # warm-up: lazy CUDA initialisation copies too
    short, long = _memcpys(run(4)), _memcpys(run(40))
    assert short["Memcpy HtoD"] > 0  # the data, and the profiler sees copies at all
    assert short == long  # copies and syncs do not grow with the number of steps
