"""The byte transformer as a Hugging Face `transformers` model, for the `hf` export format.

A small `PretrainedConfig` / `PreTrainedModel` pair around `trainer.models.ByteTransformer`:
`save_pretrained` writes the folder (`config.json` + `model.safetensors`) and, once this module
is imported (it registers the pair with the Auto classes), `AutoModelForCausalLM.from_pretrained`
loads it back. The model's code is this module, never code shipped inside the folder, so a
folder is loaded without `trust_remote_code`.

Imported only where `transformers` is installed (the `ml` extra); the rest of trainer never
imports it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from trainer.models import ByteTransformer
from trainer.spec import ModelSpec

MODEL_TYPE = "gpuflex_byte_transformer"


class ByteTransformerConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 64,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        super().__init__(**kwargs)

    def model_spec(self) -> ModelSpec:
        return ModelSpec(
            arch="transformer", d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads
        )


class ByteTransformerForCausalLM(PreTrainedModel):
    config_class = ByteTransformerConfig
    base_model_prefix = "model"

    def __init__(self, config: ByteTransformerConfig) -> None:
        super().__init__(config)
        self.model = ByteTransformer(config.seq_len, config.vocab_size, config.model_spec())
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # the weights always come from a trained state dict; torch's defaults are fine
        return None

    def forward(self, input_ids: torch.Tensor, **_: Any) -> CausalLMOutput:
        return CausalLMOutput(logits=self.model(input_ids))


AutoConfig.register(MODEL_TYPE, ByteTransformerConfig)
AutoModelForCausalLM.register(ByteTransformerConfig, ByteTransformerForCausalLM)
