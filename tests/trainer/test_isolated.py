"""trainer/isolated.py: a buyer's files read and built in a child under limits; what goes wrong
there ends the child and comes back as an IsolatedError, never in the caller's process; and
trainer/hf_limits.py, a config's numbers bounded before anything builds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.test_text_formats import LINES, bpe_tokenizer_json
from trainer.hf_limits import bound_problems, least_parameters
from trainer.isolated import IsolatedError, Limits, read_dataset, read_model, run_step
from trainer.spec import SpecError, parse_spec

ROOMY = Limits(memory_bytes=4 * 2**30, seconds=300)


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join([*LINES, "a" * 60 + "!"]), encoding="utf-8")
    return path


def test_a_panicking_tokenizer_ends_in_the_child_with_its_reason(tmp_path: Path) -> None:
    tokenizer = json.loads(bpe_tokenizer_json(LINES))
    tokenizer["normalizer"] = {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"},
                               "content": "b"}  # fmt: skip
    (tmp_path / "tok.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    request = {"dataset": {"kind": "text", "path": str(_corpus(tmp_path)), "seq_len": 8,
                           "tokenizer": str(tmp_path / "tok.json")}, "seed": 0}  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(IsolatedError) as caught:
        run_step("dataset", request, work, ROOMY)
    assert caught.value.kind == "crash"
    assert "retry-limit-in-match" in caught.value.reason

    # the same step with a sound tokenizer: the dataset comes back as safetensors
    (tmp_path / "tok.json").write_text(bpe_tokenizer_json(LINES), encoding="utf-8")
    result = run_step("dataset", request, work, ROOMY)
    data = read_dataset(work, result)
    assert data.task == "language_model" and data.num_classes == 300
    assert data.input_shape == (8,) and data.num_train > 0 and data.lengths_train is not None


def test_a_model_past_the_memory_limit_ends_the_child_alone(tmp_path: Path) -> None:
    """A 17 GB MLP built for real under a 2 GiB address space: the child fails, not us."""
    request = {"model": {"arch": "mlp", "hidden": [65536, 65536]}, "input_shape": [64],
               "num_classes": 10, "seed": 0}  # fmt: skip
    with pytest.raises(IsolatedError) as caught:
        run_step("model", request, tmp_path, Limits(memory_bytes=2 * 2**30, seconds=300))
    assert caught.value.kind == "memory", caught.value.reason
    assert "memory" in caught.value.reason


def test_a_child_that_dies_without_a_result_is_reported(tmp_path: Path) -> None:
    """64 MiB of address space is too little for the interpreter and torch: the child dies
    without a result (OpenBLAS gives up while torch loads), and the caller says why."""
    request = {"model": {"arch": "mlp", "hidden": [4]}, "input_shape": [4], "num_classes": 2,
               "seed": 0}  # fmt: skip
    with pytest.raises(IsolatedError) as caught:
        run_step("model", request, tmp_path, Limits(memory_bytes=64 * 2**20, seconds=300))
    assert caught.value.kind == "memory", caught.value.reason
    assert "64 MiB memory limit" in caught.value.reason


def test_a_model_is_built_in_the_child_and_read_back(tmp_path: Path) -> None:
    request = {"model": {"arch": "mlp", "hidden": [8]}, "input_shape": [4], "num_classes": 3,
               "seed": 5}  # fmt: skip
    run_step("model", request, tmp_path, ROOMY)
    state = read_model(tmp_path)
    from trainer.models import build_model
    from trainer.spec import ModelSpec

    here = build_model(ModelSpec(arch="mlp", hidden=[8]), (4,), 3, seed=5).state_dict()
    assert state.keys() == here.keys()
    assert all(torch.equal(state[k], here[k]) for k in here)


def _hf(config: dict) -> dict:
    return {"name": "x", "dataset": {"kind": "text", "path": "c.txt"},
            "model": {"arch": "hf_causal_lm", "config": config}}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"model_type": "gpt2", "n_embd": 65536, "n_layer": 1000}, "config.n_embd"),
        ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 10000},
         "config.num_hidden_layers"),
        ({"model_type": "llama", "vocab_size": 2**40}, "config.vocab_size"),
        ({"model_type": "llava", "text_config": {"hidden_size": 2**20}},
         "config.text_config.hidden_size"),
        ({"model_type": "gpt2", "n_layer": -3}, "config.n_layer"),
        ({"model_type": "gpt2", "bos_token_id": 10**30}, "config.bos_token_id"),
    ],
)  # fmt: skip
def test_a_config_past_any_real_model_is_refused_by_the_spec(config: dict, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(_hf(config))
    ((where, reason),) = caught.value.problems
    assert where == "model" and reason.split(": ")[0].endswith(field), reason


def test_real_configs_pass_and_their_least_parameters_stay_below_their_size() -> None:
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "n_positions": 1024, "rope_theta": 1e12}  # fmt: skip
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
             "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000,
             "max_position_embeddings": 4096, "rope_theta": 10000.0}  # fmt: skip
    for config, real in ((gpt2, 124_439_808), (llama, 6_738_415_616)):
        assert bound_problems(config) == []
        parse_spec(_hf(config))
        least, said = least_parameters(config)
        assert 0 < least <= real and "layer" in said
