"""Hugging Face models from a config.json, checkpoints, LoRA: only adapters train and travel."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch

from trainer.aggregation import ClientUpdate, FedAdam, FedAvg
from trainer.datasets import Dataset
from trainer.local import train_local
from trainer.lora import update_keys, update_part
from trainer.models import (
    ModelSpecError,
    build_model,
    checkpoint_weights,
    model_size,
    resolve_model_files,
)
from trainer.spec import ModelSpec, SpecError, parse_spec
from trainer.updates import UpdateRejected, decode_update, encode_state

pytest.importorskip("transformers")
pytest.importorskip("peft")

SEQ = 16
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
        "n_positions": 64}  # fmt: skip
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "max_position_embeddings": 64}  # fmt: skip


def _lm_data(n: int = 24, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, SEQ), generator=g)
    y = torch.roll(x, -1, dims=1)
    return Dataset(name="lm", task="language_model", x_train=x, y_train=y, x_test=x[:6],
                   y_test=y[:6], num_classes=256, input_shape=(SEQ,))  # fmt: skip


def _spec(model: dict, **sections) -> object:
    return parse_spec({"name": "hf", "model": model, "local": {"steps": 2, "batch_size": 8},
                       "optimizer": {"name": "adamw", "lr": 0.01}, **sections})  # fmt: skip


def _hf_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What `save_pretrained` would write for the wrapped transformers model."""
    return {k: v.detach().clone() for k, v in model.hf.state_dict().items()}


@pytest.mark.parametrize("config", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_causal_lm_from_config_is_causal_and_seeded(config: dict) -> None:
    spec = ModelSpec(arch="hf_causal_lm", config=config)
    a, b = build_model(spec, (SEQ,), 256, seed=3), build_model(spec, (SEQ,), 256, seed=3)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    x = torch.randint(0, 256, (2, SEQ))
    out = a.eval()(x)
    assert out.shape == (2, SEQ, 256)
    later = x.clone()
    later[:, -1] = (later[:, -1] + 1) % 256
    assert torch.allclose(a(later)[:, :-1], out[:, :-1], atol=1e-5)
    other = build_model(spec, (SEQ,), 256, seed=4)
    assert not torch.equal(
        other.state_dict()["hf.lm_head.weight"], a.state_dict()["hf.lm_head.weight"]
    )


def test_seq_cls_takes_token_ids_even_as_floats() -> None:
    spec = ModelSpec(arch="hf_seq_cls", config=LLAMA)
    model = build_model(spec, (SEQ,), 3).eval()
    ids = torch.randint(1, 256, (4, SEQ))
    assert model(ids).shape == (4, 3)
    assert torch.allclose(model(ids.float()), model(ids))  # a tabular file's columns are floats


def test_checkpoint_loads_and_gives_identical_outputs(tmp_path: Path) -> None:
    spec = ModelSpec(arch="hf_causal_lm", config=GPT2)
    trained = build_model(spec, (SEQ,), 256, seed=11).eval()
    state = _hf_state(trained)
    state.pop("lm_head.weight")  # tied to the embeddings: save_pretrained writes it once
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(__import__("json").dumps(GPT2))

    named = ModelSpec(arch="hf_causal_lm", config="config.json", checkpoint="model.safetensors")
    resolved = resolve_model_files(named, tmp_path)
    assert resolved.config == GPT2 and Path(resolved.checkpoint).is_absolute()
    loaded = build_model(resolved, (SEQ,), 256, seed=0, weights=checkpoint_weights(resolved))
    x = torch.randint(0, 256, (3, SEQ))
    assert torch.equal(loaded.eval()(x), trained(x))


def test_a_checkpoint_that_does_not_fit_is_refused() -> None:
    spec = ModelSpec(arch="hf_causal_lm", config=GPT2)
    state = _hf_state(build_model(spec, (SEQ,), 256))
    wrong = {**state, "transformer.wte.weight": torch.zeros(10, 64)}
    with pytest.raises(ModelSpecError, match="shape"):
        build_model(spec, (SEQ,), 256, weights=wrong)
    with pytest.raises(ModelSpecError, match="lacks"):
        build_model(
            spec, (SEQ,), 256, weights={"transformer.wte.weight": state["transformer.wte.weight"]}
        )
    with pytest.raises(ModelSpecError, match="lacks"):  # the other way: unknown tensors
        build_model(spec, (SEQ,), 256, weights={**state, "extra.weight": torch.zeros(1)})


def test_spec_refuses_remote_code_and_misplaced_fields() -> None:
    with pytest.raises(SpecError, match="auto_map"):
        parse_spec({"name": "x", "model": {"arch": "hf_causal_lm",
                    "config": {**GPT2, "auto_map": {"AutoModel": "evil.Model"}}}})  # fmt: skip
    with pytest.raises(SpecError, match="needs a 'config'"):
        parse_spec({"name": "x", "model": {"arch": "hf_seq_cls"}})
    with pytest.raises(SpecError, match="lora"):
        parse_spec({"name": "x", "model": {"arch": "cnn", "lora": {"r": 4}}})
    with pytest.raises(ModelSpecError, match=r"Unrecognized|cannot be used"):
        build_model(ModelSpec(arch="hf_causal_lm", config={"model_type": "no-such"}), (SEQ,), 256)
    with pytest.raises(ModelSpecError, match="max_position_embeddings"):
        build_model(ModelSpec(arch="hf_causal_lm", config=GPT2), (128,), 256)


def test_lora_trains_only_adapters_and_the_update_holds_only_them() -> None:
    spec = _spec({"arch": "hf_causal_lm", "config": GPT2, "lora": {"r": 4, "alpha": 8}})
    model = build_model(spec.model, (SEQ,), 256, seed=0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert trainable == set(update_keys(spec.model, state))  # one rule, by name, agrees with peft
    assert trainable and all(".lora_" in n for n in trainable)

    result = train_local(model, state, _lm_data(), spec, seed=1)
    assert set(result.delta) == trainable
    assert any(float(d.abs().max()) > 0 for d in result.delta.values())
    after = model.state_dict()
    frozen = [k for k in state if k not in trainable]
    assert all(torch.equal(after[k], state[k]) for k in frozen)  # the base never moved

    payload = encode_state(result.delta)
    update, _ = decode_update(payload, update_part(spec.model, state))
    assert update.keys() == result.delta.keys()
    with pytest.raises(UpdateRejected):  # a full-model reference refuses it: the rule matters
        decode_update(payload, state)
    full = len(encode_state(state))
    assert len(payload) * 20 < full  # adapters are a small part of the model's bytes


def test_seq_cls_lora_also_trains_the_new_head() -> None:
    spec = ModelSpec(arch="hf_seq_cls", config=LLAMA, lora={"r": 2})
    model = build_model(spec, (SEQ,), 3)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(update_keys(spec, model.state_dict()))
    assert any("modules_to_save" in n for n in trainable)


@pytest.mark.parametrize("strategy", [FedAvg(), FedAdam(server_lr=0.01)], ids=["fedavg", "fedadam"])
def test_aggregating_lora_deltas_moves_only_the_adapters(strategy) -> None:
    spec = _spec({"arch": "hf_causal_lm", "config": GPT2, "lora": {"r": 4}})
    model = build_model(spec.model, (SEQ,), 256, seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    deltas = [train_local(model, state, _lm_data(seed=s), spec, seed=s).delta for s in (1, 2)]
    updates = [ClientUpdate(f"n{i}", d, 10 * (i + 1)) for i, d in enumerate(deltas)]
    new = strategy.aggregate(state, updates)
    assert new.keys() == state.keys()
    for k in state:
        if k in deltas[0]:
            continue
        assert torch.equal(new[k], state[k]), k
    if isinstance(strategy, FedAvg):  # the sample-weighted mean, added to the adapters
        for k in deltas[0]:
            want = state[k] + (10 * deltas[0][k] + 20 * deltas[1][k]) / 30
            assert torch.allclose(new[k], want, atol=1e-6), k
    else:
        assert any(not torch.equal(new[k], state[k]) for k in deltas[0])
    # the merged model behaves as the base plus the aggregated adapters
    model.load_state_dict(new)
    merged = model.hf.merge_and_unload()
    x = torch.randint(0, 256, (2, SEQ))
    model2 = build_model(spec.model, (SEQ,), 256, seed=0)
    model2.load_state_dict(new)
    assert torch.allclose(merged.eval()(input_ids=x).logits, model2.eval()(x), atol=1e-5)


def test_model_size_counts_base_and_adapters() -> None:
    plain = model_size(ModelSpec(arch="hf_causal_lm", config=GPT2), (SEQ,), 256, True)
    lora = model_size(ModelSpec(arch="hf_causal_lm", config=GPT2, lora={"r": 4}), (SEQ,), 256, True)
    adapters = 2 * 4 * (64 + 3 * 64)  # two layers' c_attn: A (4x64) and B (192x4)
    assert lora[0] == plain[0] + adapters
