"""The formats a trained model exports to (trainer/export.py): pure names, so the web process
lists them without importing torch (issue 36)."""

from __future__ import annotations

from typing import Literal, get_args

from trainer.spec import ModelSpec

# pt2: an exported model's program (model.arch: exported) with the trained weights in it
Format = Literal["safetensors", "hf", "onnx", "torchscript", "pt2"]
FORMATS: tuple[str, ...] = get_args(Format)
# architectures that have a `transformers` model (trainer.hf_byte)
HF_ARCHS = frozenset({"transformer"})


def hf_refusal(spec: ModelSpec) -> str | None:
    """Why `hf` cannot export this architecture, or None when it can."""
    if spec.arch in HF_ARCHS:
        return None
    return (
        f"format 'hf' needs a Hugging Face architecture; model.arch '{spec.arch}' has none "
        f"(only {', '.join(sorted(HF_ARCHS))}): use safetensors, onnx or torchscript"
    )
