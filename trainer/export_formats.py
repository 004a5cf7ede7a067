"""The formats a trained model exports to (trainer/export.py): pure names, so the web process
lists them without importing torch (issue 36)."""

from __future__ import annotations

from typing import Literal, get_args

# pt2: an exported model's program (model.arch: exported) with the trained weights in it
Format = Literal["safetensors", "hf", "onnx", "torchscript", "pt2"]
FORMATS: tuple[str, ...] = get_args(Format)
