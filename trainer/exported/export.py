"""Making a program from a buyer's module and loss: what the SDK's Client.fit and
`gpuflex export-model` run on the buyer's machine (never on a node).

The module and its loss are wrapped so that forward(inputs, targets) returns the loss and
the logits, exported with torch.export with a dynamic batch dimension shared by both
inputs, and saved with torch.export.save. Parameter names are the module's under
`model.` (the wrapper's attribute).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class WithLoss(nn.Module):
    """`model` and `loss` as one module: forward(x, y) -> (loss, logits), or the loss alone
    with `logits=False` (a per-pixel loss, whose outputs are no class scores)."""

    def __init__(self, model: nn.Module, loss: LossFn, logits: bool = True) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.logits = logits

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        out = self.model(x)
        return (self.loss(out, y), out) if self.logits else self.loss(out, y)


def export_program(
    model: nn.Module,
    loss: LossFn,
    example_inputs: tuple[torch.Tensor, torch.Tensor],
    path: Path | str,
    *,
    logits: bool = True,
) -> Path:
    """Export `model` with `loss` on `example_inputs` (a batch of inputs and targets, of at
    least two samples: a batch of one would be specialized) to the .pt2 file `path`."""
    x, y = example_inputs
    if x.shape[0] < 2 or y.shape[0] != x.shape[0]:
        raise ValueError("example_inputs: a batch of at least 2 inputs and as many targets")
    wrapped = WithLoss(model, loss, logits).train()
    batch = torch.export.Dim("batch")
    program = torch.export.export(wrapped, (x, y), dynamic_shapes=({0: batch}, {0: batch}))
    path = Path(path)
    torch.export.save(program, str(path))
    return path
