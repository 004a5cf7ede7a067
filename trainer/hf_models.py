"""Hugging Face `transformers` architectures built from a config.json, never from a hub.

`arch: hf_causal_lm` builds `AutoModelForCausalLM.from_config(config)`, `hf_seq_cls`
`AutoModelForSequenceClassification`; the config is the spec's (inline, as the marketplace
stores it, or read from a path by `trainer.models.resolve_model_files`). Weights are fresh from
the seed, or the buyer's safetensors state dict of that model. Nothing is downloaded: no name
or path goes to `from_pretrained`, and a config's `auto_map` (remote code) is refused by the
spec. With `lora`, peft wraps the model (trainer.lora) after the base weights are in.

transformers and peft are imported inside the functions: trainer/ stays importable where
they are not installed, and only jobs that name these archs pay their import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainer.spec import ModelSpec


class HFModelError(ValueError):
    """The config or checkpoint cannot make this model (said in the message)."""


class HFModel(nn.Module):
    """A transformers model as the zoo's models are called: token ids in, logits out.

    Token ids may arrive as floats (a tabular file's columns are read as float32, and ids
    below 2^24 are exact there): they are cast back to integers."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.hf = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.long() if x.is_floating_point() else x
        return self.hf(input_ids=ids).logits


def hf_config(spec: ModelSpec, num_classes: int) -> Any:
    """The transformers config of the spec's inline config.json, fitted to the data."""
    from transformers import AutoConfig

    if not isinstance(spec.config, dict):
        raise HFModelError("the config must be inline here (resolve_model_files reads a path)")
    data = dict(spec.config)
    model_type = data.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path"):
        data.pop(key, None)
    try:
        config = AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError) as exc:
        raise HFModelError(f"config.json cannot be used: {exc}") from None
    if spec.arch == "hf_seq_cls":
        config.num_labels = num_classes
        if config.pad_token_id is None:  # a padded batch needs one; token 0 pads here
            config.pad_token_id = 0
    return config


def check_fits_data(config: Any, spec: ModelSpec, input_shape: tuple[int, ...],
                    num_classes: int) -> None:  # fmt: skip
    if len(input_shape) != 1:
        raise HFModelError(f"{spec.arch} needs token sequences; got input {input_shape}")
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and input_shape[0] > positions:
        raise HFModelError(
            f"sequences of {input_shape[0]} tokens are longer than the model's "
            f"max_position_embeddings ({positions})"
        )
    if spec.arch == "hf_causal_lm" and config.vocab_size < num_classes:
        raise HFModelError(
            f"the data has {num_classes} token values but the config's vocab_size is "
            f"{config.vocab_size}"
        )


def build_hf_model(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> HFModel:
    """The model (the caller seeds torch first); `weights`: the base model's state dict."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from trainer.lora import apply_lora

    hf_logging.set_verbosity_error()  # config warnings repeat on every build
    config = hf_config(spec, num_classes)
    check_fits_data(config, spec, input_shape, num_classes)
    lm = spec.arch == "hf_causal_lm"
    auto = AutoModelForCausalLM if lm else AutoModelForSequenceClassification
    try:
        model = auto.from_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise HFModelError(f"config.json cannot be built as {spec.arch}: {exc}") from None
    if weights is not None:
        load_base_weights(model, weights)
    if spec.lora is not None:
        task = "CAUSAL_LM" if spec.arch == "hf_causal_lm" else "SEQ_CLS"
        model = apply_lora(model, spec.lora, task)
    return HFModel(model)


def load_base_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Load a checkpoint's state dict: every tensor must belong to the model with its shape,
    and the model's tensors it leaves out may only be tied to ones it has (an LM head tied
    to the embeddings, which `save_pretrained` writes once)."""
    own = model.state_dict()
    unexpected = sorted(set(weights) - set(own))
    if unexpected:
        raise HFModelError(f"the checkpoint has tensors the model lacks: {unexpected[:5]}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise HFModelError(
                f"checkpoint tensor '{name}' has shape {list(tensor.shape)}; the model's is "
                f"{list(own[name].shape)}"
            )
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ids = {id(params[n]) for n in weights if n in params}
    untied = [n for n in own if n not in weights and id(params.get(n)) not in loaded_ids]
    if untied:
        raise HFModelError(f"the checkpoint lacks the model's tensors {untied[:5]}")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in weights.items()}, strict=False)
