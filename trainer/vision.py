"""Image models of real size: ResNet-18 and ViT-S/16, written here rather than taken from
torchvision or timm.

torchvision's wheel on PyPI for torch 2.13.0 (torchvision 0.28.0) is the CUDA build: its C
extension links libtorch_cuda, which the CPU torch wheel (2.13.0+cpu, what CPU nodes and CI
install) lacks, so `import torchvision` fails there; timm requires torchvision, and pip would
replace torch 2.13 to install it. The architectures are small enough to write out: they follow
torchvision's ResNet-18 and ViT-S/16 (timm's `vit_small_patch16_224`) layer for layer, with
GroupNorm in place of BatchNorm (federated averaging of batch statistics is ill-defined, and
it keeps every state tensor floating, as in the rest of the zoo). Weights are fresh from the
seed or loaded from a buyer's safetensors checkpoint of this layout; nothing is downloaded.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

RESNET18_CHANNELS = (64, 128, 256, 512)
# ViT-S: 12 layers of width 384, 6 heads, MLP 4x
VIT_S = {"depth": 12, "width": 384, "heads": 6, "mlp": 1536}
# below this side ResNet-18's ImageNet stem (7x7 stride 2, then max-pool) leaves too little
# of the image: small images get the CIFAR stem (3x3 stride 1, no pool)
IMAGENET_STEM_MIN_SIDE = 64


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, 32), channels)


def _run(blocks: nn.Sequential, x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
    return x


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = _norm(c_out)
        self.downsample = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _norm(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.downsample(x))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout (conv1, layer1..layer4 of two BasicBlocks, fc)."""

    def __init__(
        self, image: tuple[int, int, int], num_classes: int, checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.image = image
        self.checkpointing = checkpointing
        c, side = image[0], image[1]
        if side >= IMAGENET_STEM_MIN_SIDE:
            self.conv1 = nn.Conv2d(c, 64, 7, stride=2, padding=3, bias=False)
            self.pool: nn.Module = nn.MaxPool2d(3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(c, 64, 3, stride=1, padding=1, bias=False)
            self.pool = nn.Identity()
        self.bn1 = _norm(64)
        blocks: list[nn.Module] = []
        width = 64
        for stage, out in enumerate(RESNET18_CHANNELS):
            stride = 1 if stage == 0 else 2
            blocks += [BasicBlock(width, out, stride), BasicBlock(out, out, 1)]
            width = out
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x.view(-1, *self.image)))))
        x = _run(self.layers, x, self.checkpointing and self.training)
        return self.fc(x.mean(dim=(2, 3)))


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block (bidirectional attention)."""

    def __init__(self, width: int, heads: int, mlp: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp), nn.GELU(), nn.Linear(mlp, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class ViTS(nn.Module):
    """ViT-S: patch embedding, a class token, learned positions, 12 encoder blocks."""

    def __init__(
        self,
        image: tuple[int, int, int],
        num_classes: int,
        patch: int = 16,
        dropout: float = 0.0,
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        c, h, w = image
        if h % patch or w % patch:
            raise ValueError(
                f"ViT-S needs image sides divisible by patch_size {patch}; got {h}x{w}"
            )
        self.image = image
        self.checkpointing = checkpointing
        width = VIT_S["width"]
        self.patch_embed = nn.Conv2d(c, width, patch, stride=patch)
        tokens = (h // patch) * (w // patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, width) * 0.02)
        self.blocks = nn.Sequential(
            *(
                EncoderBlock(width, VIT_S["heads"], VIT_S["mlp"], dropout)
                for _ in range(VIT_S["depth"])
            )
        )
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x.view(-1, *self.image)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = _run(self.blocks, x, self.checkpointing and self.training)
        return self.head(self.norm(x[:, 0]))
