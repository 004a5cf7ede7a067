"""The formats a trained model exports to (trainer/export.py): pure names, so the web process
lists them without importing torch (issue 36)."""

from __future__ import annotations

from typing import Literal, get_args

Format = Literal["safetensors", "hf", "onnx", "torchscript"]
FORMATS: tuple[str, ...] = get_args(Format)
