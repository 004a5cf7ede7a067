"""The model zoo: every model is built from the spec alone, so no user code ever runs on a node.

GroupNorm rather than BatchNorm throughout: federated averaging of batch statistics is
ill-defined, and it keeps every state tensor floating so updates are plain deltas.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from trainer.spec import HF_ARCHS, ModelSpec


class ModelSpecError(ValueError):
    """The model section does not fit the dataset (e.g. a CNN on sequence data)."""


def _image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """A [C, H, W] view of the input: flat square inputs such as digits' 64 become 1x8x8."""
    if len(input_shape) == 3:
        return input_shape  # type: ignore[return-value]
    if len(input_shape) == 1:
        side = math.isqrt(input_shape[0])
        if side * side == input_shape[0]:
            return (1, side, side)
    raise ModelSpecError(
        f"convolutional models need image input [C,H,W] or a flat square; got {input_shape}"
    )


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: list[int], num_classes: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def _groups(channels: int) -> int:
    return math.gcd(channels, 8)


class SmallCNN(nn.Module):
    def __init__(self, image: tuple[int, int, int], channels: list[int], num_classes: int):
        super().__init__()
        self.image = image
        layers: list[nn.Module] = []
        c_in, side = image[0], image[1]
        for c_out in channels:
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(_groups(c_out), c_out)]
            layers.append(nn.ReLU())
            if side >= 4:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x.view(-1, *self.image))
        return self.head(x.mean(dim=(2, 3)))


def _run_blocks(blocks: nn.Sequential, x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    """With checkpointing, each block keeps only its input and recomputes the rest in the
    backward pass (non-reentrant: also replays dropout's RNG and autocast)."""
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
    return x


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, out: int | None = None, stride: int = 1):
        super().__init__()
        out = out or channels
        self.conv1 = nn.Conv2d(channels, out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(_groups(out), out)
        self.conv2 = nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(_groups(out), out)
        self.shortcut = (
            nn.Sequential(
                nn.Conv2d(channels, out, 1, stride=stride, bias=False),
                nn.GroupNorm(_groups(out), out),
            )
            if stride != 1 or out != channels
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.shortcut(x) + self.norm2(self.conv2(y)))


class SmallResNet(nn.Module):
    """One stage of `blocks` residual blocks per entry of `channels`; every stage after the
    first halves the resolution (while it is at least 4), as in ResNet-18's
    channels [64, 128, 256, 512] with 2 blocks each."""

    def __init__(
        self,
        image: tuple[int, int, int],
        channels: list[int],
        blocks: int,
        num_classes: int,
        checkpointing: bool = False,
    ):
        super().__init__()
        self.image = image
        self.checkpointing = checkpointing
        width, side = channels[0], image[1]
        self.stem = nn.Sequential(
            nn.Conv2d(image[0], width, 3, padding=1, bias=False),
            nn.GroupNorm(_groups(width), width),
            nn.ReLU(),
        )
        layers: list[nn.Module] = []
        for stage, out in enumerate(channels):
            stride = 2 if stage and side >= 4 else 1
            side //= stride
            for i in range(blocks):
                layers.append(ResidualBlock(width, out, stride if i == 0 else 1))
                width = out
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x.view(-1, *self.image))
        x = _run_blocks(self.blocks, x, self.checkpointing and self.training)
        return self.head(x.mean(dim=(2, 3)))


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ByteTransformer(nn.Module):
    """A small decoder-only language model over bytes (vocabulary 256)."""

    def __init__(self, seq_len: int, vocab: int, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(vocab, spec.d_model)
        self.pos = nn.Embedding(seq_len, spec.d_model)
        self.blocks = nn.Sequential(
            *(DecoderBlock(spec.d_model, spec.n_heads, spec.dropout) for _ in range(spec.n_layers))
        )
        self.ln = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, vocab, bias=False)
        self.checkpointing = spec.checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        h = self.tok(x) + self.pos(positions)
        h = _run_blocks(self.blocks, h, self.checkpointing and self.training)
        return self.head(self.ln(h))


def build_model(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Deterministic initial weights for a seed: every node and the server agree on round 0.

    `weights`: the spec's checkpoint (`read_weights`), loaded over the seed's; for a LoRA
    model they are the base's, and the adapters still come from the seed."""
    torch.manual_seed(seed)
    if spec.arch == "exported":  # the buyer's program, with its own weights
        return _program(spec, input_shape, weights)
    if spec.arch in HF_ARCHS:
        return _hf(spec, input_shape, num_classes, weights)
    model = _zoo(spec, input_shape, num_classes)
    if weights is not None:
        try:
            model.load_state_dict(dict(weights))
        except RuntimeError as exc:
            raise ModelSpecError(f"the checkpoint does not fit the model: {exc}") from None
    return model


def _hf(
    spec: ModelSpec,
    input_shape: tuple[int, ...],
    num_classes: int,
    weights: Mapping[str, torch.Tensor] | None,
) -> nn.Module:
    from trainer.hf_models import HFModelError, build_hf_model
    from trainer.lora import LoraError

    try:
        return build_hf_model(spec, input_shape, num_classes, weights)
    except (HFModelError, LoraError) as exc:
        raise ModelSpecError(str(exc)) from None


def _program(
    spec: ModelSpec, input_shape: tuple[int, ...], weights: Mapping[str, torch.Tensor] | None
) -> nn.Module:
    from trainer.exported.archive import ArchiveError
    from trainer.exported.gate import GateError
    from trainer.exported.loader import program_module

    try:
        model = program_module(str(spec.program), input_shape)
    except (ArchiveError, GateError) as exc:
        raise ModelSpecError(f"model.program: {exc}") from None
    except OSError as exc:
        raise ModelSpecError(f"model.program: cannot read {spec.program}: {exc}") from None
    if weights is not None:
        try:
            model.load_state_dict(dict(weights))
        except RuntimeError as exc:
            raise ModelSpecError(f"the weights do not fit the program: {exc}") from None
    return model


def _zoo(spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if spec.arch == "mlp":
        return MLP(math.prod(input_shape), list(spec.hidden), num_classes, spec.dropout)
    if spec.arch == "cnn":
        return SmallCNN(_image_shape(input_shape), list(spec.channels), num_classes)
    if spec.arch == "resnet":
        image = _image_shape(input_shape)
        return SmallResNet(image, list(spec.channels), spec.blocks, num_classes, spec.checkpointing)
    if spec.arch in ("resnet18", "vit_s"):
        from trainer.vision import ResNet18, ViTS

        image = _image_shape(input_shape)
        if spec.arch == "resnet18":
            return ResNet18(image, num_classes, spec.checkpointing)
        try:
            return ViTS(image, num_classes, spec.patch_size, spec.dropout, spec.checkpointing)
        except ValueError as exc:
            raise ModelSpecError(str(exc)) from None
    if len(input_shape) != 1:
        raise ModelSpecError(f"the transformer needs token sequences; got input {input_shape}")
    return ByteTransformer(input_shape[0], num_classes, spec)


def read_weights(data: bytes) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors from safetensors bytes: parsed, never unpickled."""
    try:
        return safetensors.torch.load(data)
    except Exception as exc:  # SafetensorError and friends: the bytes are not safetensors
        raise ModelSpecError(f"the checkpoint is not a readable safetensors file: {exc}") from None


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def meta_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors as meta tensors (names, shapes, dtypes; no data): enough
    to check a checkpoint against a model built on the meta device, reading its header only."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                part = f.get_slice(name)
                dtype = _SAFETENSORS_DTYPES.get(part.get_dtype())
                if dtype is None:
                    raise ModelSpecError(f"checkpoint tensor '{name}': dtype {part.get_dtype()}")
                out[name] = torch.empty(part.get_shape(), dtype=dtype, device="meta")
            return out
    except ModelSpecError:
        raise
    except Exception as exc:  # SafetensorError and friends: the bytes are not safetensors
        raise ModelSpecError(f"the checkpoint is not a readable safetensors file: {exc}") from None


def resolve_model_files(spec: ModelSpec, base_dir: Path | None = None) -> ModelSpec:
    """The spec with a config path read into an inline config and a checkpoint path made
    absolute, both relative to `base_dir` (the spec file's folder) when given."""

    def where(name: str) -> Path:
        path = Path(name).expanduser()
        return path if path.is_absolute() or base_dir is None else Path(base_dir) / path

    changes: dict[str, object] = {}
    if isinstance(spec.config, str):
        path = where(spec.config)
        try:
            changes["config"] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelSpecError(f"model.config: cannot read {path}: {exc}") from None
    if spec.checkpoint is not None:
        changes["checkpoint"] = str(where(spec.checkpoint))
    if spec.program is not None:
        changes["program"] = str(where(spec.program))
    if not changes:
        return spec
    return ModelSpec.model_validate({**spec.model_dump(mode="json"), **changes})


def checkpoint_weights(spec: ModelSpec) -> dict[str, torch.Tensor] | None:
    """The tensors of a resolved spec's checkpoint file, or None when it names none."""
    if spec.checkpoint is None:
        return None
    try:
        data = Path(spec.checkpoint).read_bytes()
    except OSError as exc:
        raise ModelSpecError(f"model.checkpoint: cannot read {spec.checkpoint}: {exc}") from None
    return read_weights(data)


def model_size(
    spec: ModelSpec, input_shape: tuple[int, ...], num_classes: int, integer_input: bool = False
) -> tuple[int, int]:
    """(parameters, fp32 bytes of the state dict) without allocating the weights: the model
    is built, and one sample run through it, on the meta device, so a spec asking for
    billions of parameters costs nothing to measure before it is refused, and one that
    does not fit its data (an image too small for its pooling) is found all the same."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(spec, input_shape, num_classes)
        sample = torch.zeros((1, *input_shape), dtype=torch.long if integer_input else None)
        try:
            with torch.no_grad():
                forward_sample(model.eval(), sample)
        except RuntimeError as exc:
            raise ModelSpecError(
                f"the model does not fit inputs of shape {input_shape}: {exc}"
            ) from None
    params = sum(p.numel() for p in model.parameters())
    return params, 4 * sum(t.numel() for t in model.state_dict().values())


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    parameters: int
    flops_per_sample: int  # forward pass; training costs about three times this
    bytes_fp32: int


def describe_model(
    model: nn.Module, input_shape: tuple[int, ...], integer_input: bool
) -> ModelInfo:
    params = sum(p.numel() for p in model.parameters())
    sample = (
        torch.zeros((1, *input_shape), dtype=torch.long)
        if integer_input
        else torch.zeros((1, *input_shape))
    )
    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        forward_sample(model, sample)
    model.train(was_training)
    return ModelInfo(
        arch=type(model).__name__,
        parameters=params,
        flops_per_sample=int(counter.get_total_flops()),
        bytes_fp32=4 * sum(t.numel() for t in model.state_dict().values()),
    )


def forward_sample(model: nn.Module, sample: torch.Tensor) -> torch.Tensor:
    """The model's output on one sample: a program's on that sample and a zero target
    (it computes its loss too: counted, as training runs it)."""
    from trainer.exported.runtime import is_program, loss_and_logits

    if not is_program(model):
        return model(sample)
    from trainer.exported.loader import sample_batch

    x, y = sample_batch(model, tuple(sample.shape[1:]), sample.device)
    loss, logits = loss_and_logits(model, x.to(sample.dtype), y)
    return loss if logits is None else logits
