"""A small VGG the buyer defines (two conv blocks, batch norm, dropout) for scikit-learn's
8x8 digits, exported with its loss as a torch.export program for `model.arch: exported`.

    python examples/custom-vgg/model.py            # writes examples/custom-vgg/vgg.pt2
    gpuflex-sim run examples/custom-vgg/job.yaml   # or: gpuflex submit examples/custom-vgg/job.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


def block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
        nn.MaxPool2d(2),
    )  # fmt: skip


class SmallVGG(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(block(1, 16), block(16, 32))  # 8x8 -> 4x4 -> 2x2
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 2 * 2, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, 8, 8)))  # digits come flat, [B, 64]


def export(path: Path) -> Path:
    from trainer.exported.export import export_program

    torch.manual_seed(0)
    example = (torch.randn(8, 64), torch.zeros(8, dtype=torch.long))
    return export_program(SmallVGG(), F.cross_entropy, example, path)


if __name__ == "__main__":
    print(export(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("vgg.pt2")))
