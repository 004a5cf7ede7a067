"""A small U-Net the buyer defines, trained with a per-pixel loss on generated images.

The task is self-supervised inpainting: the program hides every other 2x2 patch of the
image (a fixed checkerboard, a constant of the program) and the U-Net restores the whole
image; the loss is the per-pixel mean squared error against the image itself. The targets
the dataset carries (which way each rectangle lies) are not used. The program returns the
loss alone: the marketplace reports its loss, and no accuracy.

    python examples/custom-unet/model.py   # writes shapes.npz (generated) and unet.pt2
    gpuflex-sim run examples/custom-unet/job.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

SIDE = 16


def shapes(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` generated 1x16x16 images of one bright rectangle on a dark background, with
    label 1 where it is taller than wide."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 1, SIDE, SIDE), dtype=np.float32)
    y = np.zeros(n, dtype=np.int64)
    for i in range(n):
        h, w = rng.integers(3, 12, size=2)
        top, left = rng.integers(0, SIDE - h + 1), rng.integers(0, SIDE - w + 1)
        x[i, 0, top : top + h, left : left + w] = 1.0
        y[i] = int(h > w)
    return x, y


def conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(4, c_out), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1), nn.GroupNorm(4, c_out), nn.ReLU(),
    )  # fmt: skip


class UNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.down1, self.down2 = conv(1, width), conv(width, 2 * width)
        self.middle = conv(2 * width, 2 * width)
        self.up2 = nn.ConvTranspose2d(2 * width, 2 * width, 2, stride=2)
        self.dec2 = conv(4 * width, width)
        self.up1 = nn.ConvTranspose2d(width, width, 2, stride=2)
        self.dec1 = conv(2 * width, width)
        self.out = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)  # 16x16
        d2 = self.down2(F.max_pool2d(d1, 2))  # 8x8
        m = self.middle(F.max_pool2d(d2, 2))  # 4x4
        u2 = self.dec2(torch.cat([self.up2(m), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


class Inpainting(nn.Module):
    """forward(images, labels) -> the per-pixel loss of restoring the hidden patches."""

    def __init__(self) -> None:
        super().__init__()
        self.unet = UNet()
        tiles = (torch.arange(SIDE) // 2) % 2
        self.keep = (tiles[:, None] ^ tiles[None, :]).float()  # a constant of the program

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        restored = self.unet(x * self.keep)
        return F.mse_loss(restored, x)  # per pixel, every pixel


def export(folder: Path) -> tuple[Path, Path]:
    x, y = shapes()
    data = folder / "shapes.npz"
    np.savez(data, x=x, y=y)
    torch.manual_seed(0)
    example = (torch.zeros(4, 1, SIDE, SIDE), torch.zeros(4, dtype=torch.long))
    batch = torch.export.Dim("batch")
    program = torch.export.export(
        Inpainting().train(), example, dynamic_shapes=({0: batch}, {0: batch})
    )
    path = folder / "unet.pt2"
    torch.export.save(program, str(path))
    return data, path


if __name__ == "__main__":
    print(*export(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent))
