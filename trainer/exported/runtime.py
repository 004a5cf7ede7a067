"""Running a loaded program: its loss and logits, and its train/eval modes.

`ExportedProgram.module()` refuses train()/eval(): the graph was traced in one mode, and
dropout's and batch norm's mode is an argument of their operators (aten.dropout's `train`,
aten.batch_norm's `training`). install_modes gives the module train()/eval() methods that
set those arguments, so the trainer's code (model.train(), model.eval()) runs it as it runs
a zoo model.
"""

from __future__ import annotations

import types

import torch
from torch import nn

MARK = "gpuflex_program"
# operator name -> index of its mode argument
_MODE_ARGS = {"dropout": 2, "feature_dropout": 2, "alpha_dropout": 2, "batch_norm": 5,
              "instance_norm": 5}  # fmt: skip


def is_program(model: nn.Module) -> bool:
    """A buyer's exported program: called with (inputs, targets), returning the loss."""
    return bool(getattr(model, MARK, False))


def loss_and_logits(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The program's loss over the batch (a mean) and its logits, or None without them."""
    out = model(x, y)
    if isinstance(out, (tuple, list)):
        return out[0], (out[1] if len(out) > 1 else None)
    return out, None


def _mode_nodes(module: nn.Module) -> list[tuple[torch.fx.Node, int]]:
    found = []
    graph = getattr(module, "graph", None)
    for node in graph.nodes if graph is not None else ():
        op = getattr(node.target, "_overloadpacket", None)
        index = _MODE_ARGS.get(getattr(op, "__name__", ""))
        if node.op == "call_function" and index is not None and len(node.args) > index:
            found.append((node, index))
    return found


def _set_mode(self: nn.Module, mode: bool = True) -> nn.Module:
    changed = False
    for node, index in _mode_nodes(self):
        if node.args[index] != mode:
            args = list(node.args)
            args[index] = mode
            node.args = tuple(args)
            changed = True
    if changed:
        self.recompile()  # type: ignore[operator]
    for sub in self.modules():
        sub.training = mode
    return self


def install_modes(module: nn.Module) -> nn.Module:
    """`module` with working train()/eval() and marked as a program; in training mode."""
    module.train = types.MethodType(_set_mode, module)  # type: ignore[method-assign]
    module.eval = types.MethodType(lambda self: _set_mode(self, False), module)  # type: ignore[method-assign]
    setattr(module, MARK, True)
    return module.train()
