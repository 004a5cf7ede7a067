"""How many bytes a node uploads per task: a LoRA update against a full fine-tuning update.

Real updates of real causal LMs, trained one step and encoded as nodes send them
(trainer.updates.encode_state, fp32 safetensors, no compression): the full update holds every
tensor of the model, the LoRA one only the adapters (trainer.lora.update_part). Sizes, not
times, so the figures do not depend on the machine.

    python -m bench.lora_update_size            # the tiny test model and a GPT-2-small shape
    python -m bench.lora_update_size --quick    # the tiny one only
"""

from __future__ import annotations

import argparse
import json

import torch

from trainer.datasets import Dataset
from trainer.local import train_local
from trainer.models import build_model
from trainer.spec import parse_spec
from trainer.updates import encode_state

SEQ = 32
MODELS = {
    # the shape the tests use: 2 layers, width 64
    "gpt2-tiny": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
                  "vocab_size": 256, "n_positions": 64},
    # GPT-2 small's shape (124M parameters), fresh weights: nothing is downloaded
    "gpt2-small": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                   "vocab_size": 50257, "n_positions": 1024},
}  # fmt: skip
LORA = {"r": 8, "alpha": 16, "target_modules": ["c_attn"]}


def _data(vocab: int) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, min(vocab, 256), (8, SEQ), generator=g)
    y = torch.roll(x, -1, dims=1)
    return Dataset("bytes", "language_model", x, y, x[:2], y[:2], 256, (SEQ,))


def measure(name: str) -> dict[str, object]:
    config = MODELS[name]
    sizes: dict[str, int] = {}
    for kind, lora in (("full", None), ("lora", LORA)):
        spec = parse_spec({"name": name, "model": {"arch": "hf_causal_lm", "config": config,
                           **({"lora": lora} if lora else {})},
                           "local": {"steps": 1, "batch_size": 4},
                           "optimizer": {"name": "adamw", "lr": 1e-4}})  # fmt: skip
        model = build_model(spec.model, (SEQ,), 256, seed=0)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        delta = train_local(model, state, _data(config["vocab_size"]), spec, seed=1).delta
        sizes[kind] = len(encode_state(delta))
        sizes[f"{kind}_tensors"] = len(delta)
        if kind == "lora":
            sizes["parameters"] = sum(p.numel() for p in model.parameters())
            sizes["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model, state, delta
    return {"model": name, "lora_config": LORA, **sizes,
            "ratio_full_to_lora": round(sizes["full"] / sizes["lora"], 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model only")
    args = parser.parse_args()
    names = ["gpt2-tiny"] if args.quick else list(MODELS)
    print(json.dumps([measure(n) for n in names], indent=2))


if __name__ == "__main__":
    main()
