"""`gpuflex export-model module:attr --example ...`: a buyer's PyTorch model and loss as a
torch.export program (.pt2) for `model.arch: exported`, from a shell; Client.fit does the
same from a notebook (marketplace/notebook.py). Runs on the buyer's machine, with torch.

    gpuflex export-model mynet:Net --example 'float32[8,64]' --example 'int64[8]' -o net.pt2

`module:attr` names an nn.Module, or a class or function that makes one with no arguments
(imported from the current folder or the Python path). Each --example is the shape and
dtype of one input, the model's inputs first and the targets last: a batch of zeros of that
shape is what the program is traced with (its first dimension is made dynamic: the batch).
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

_EXAMPLE = re.compile(r"^(float32|float64|float16|bfloat16|int64|int32|uint8|bool)\[([\d, ]+)\]$")
LOSSES = ("cross_entropy", "mse", "l1", "binary_cross_entropy_with_logits")


class ExportModelError(ValueError):
    """What the command cannot do, said plainly (the CLI prints it, exit 2)."""


def resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ExportModelError(f"{target!r}: give module:attr, e.g. mynet:Net")
    sys.path.insert(0, str(Path.cwd()))
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExportModelError(f"cannot import {module_name!r}: {exc}") from None
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ExportModelError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def example_tensor(text: str) -> Any:
    import torch

    match = _EXAMPLE.match(text.strip())
    if match is None:
        raise ExportModelError(f"--example {text!r}: write a dtype and a shape, e.g. float32[8,64]")
    shape = [int(d) for d in match.group(2).split(",") if d.strip()]
    return torch.zeros(shape, dtype=getattr(torch, match.group(1)))


def export_model_command(
    target: str, examples: list[str], loss: str, output: Path, logits: bool = True
) -> Path:
    from torch import nn
    from torch.nn import functional as F

    from trainer.exported.export import export_program

    if len(examples) != 2:
        raise ExportModelError("give two --example: the inputs, then the targets")
    obj = resolve(target)
    model = obj if isinstance(obj, nn.Module) else obj() if callable(obj) else None
    if not isinstance(model, nn.Module):
        raise ExportModelError(f"{target!r} is not an nn.Module, nor makes one")
    loss_fn = getattr(F, loss) if loss in LOSSES else resolve(loss)
    x, y = (example_tensor(e) for e in examples)
    try:
        return export_program(model, loss_fn, (x, y), output, logits=logits)
    except ValueError as exc:
        raise ExportModelError(str(exc)) from None
