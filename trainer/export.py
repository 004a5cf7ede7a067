"""A trained state dict and its model spec, exported to the formats ML teams deploy from.

- `safetensors`: the state dict as GPUFlex stores it (with its input shape and classes).
- `torchscript`: a traced TorchScript archive (`torch.jit.load`, no Python class needed).
- `onnx`: through `torch.onnx` (the torch.export-based exporter), batch dimension dynamic.
- `hf`: a Hugging Face folder (`config.json` + `model.safetensors`), zipped, for the byte
  transformer (`trainer.hf_byte`); other architectures have no `transformers` model.

The model is always rebuilt from the spec (`build_model`) and loaded from the tensors: nothing
in a stored model is ever executed or unpickled.
"""

from __future__ import annotations

import io
import json
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from trainer.export_formats import FORMATS, HF_ARCHS, hf_refusal  # noqa: F401 (re-exported)
from trainer.models import build_model
from trainer.spec import ModelSpec
from trainer.updates import decode_state, encode_state

VOCAB = 256  # the byte transformer's vocabulary


class ExportError(ValueError):
    """This model cannot be exported to the format asked for (said in the message)."""


@dataclass(frozen=True)
class TrainedModel:
    """What an export needs: the tensors and what rebuilds the module around them."""

    state: dict[str, torch.Tensor]
    spec: ModelSpec
    input_shape: tuple[int, ...]
    num_classes: int

    @classmethod
    def from_bytes(cls, data: bytes, spec: ModelSpec) -> TrainedModel:
        """A stored GPUFlex model (safetensors whose metadata carries the data's shape)."""
        state, meta = decode_state(data)
        try:
            shape = tuple(int(d) for d in json.loads(meta["input_shape"]))
            classes = int(meta["num_classes"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ExportError(f"the model file lacks its input shape or classes: {exc}") from None
        return cls(state, spec, shape, classes)

    @property
    def integer_input(self) -> bool:
        return self.spec.arch == "transformer"

    def module(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # build_model seeds; leave the caller's RNG be
            model = build_model(self.spec, self.input_shape, self.num_classes)
        model.load_state_dict(self.state)
        return model.eval()

    def example_input(self, batch: int = 2) -> torch.Tensor:
        gen = torch.Generator().manual_seed(0)
        shape = (batch, *self.input_shape)
        if self.integer_input:
            return torch.randint(0, self.num_classes, shape, generator=gen)
        return torch.randn(shape, generator=gen)


@dataclass(frozen=True)
class Exported:
    data: bytes
    suffix: str  # file name ending: ".onnx", ".hf.zip", ...
    content_type: str


def export_model(model: TrainedModel, fmt: str) -> Exported:
    if fmt == "pt2" or (model.spec.arch == "exported" and fmt != "safetensors"):
        raise ExportError(
            "an exported model downloads as pt2 (its program, trained) or safetensors; pt2 "
            "is for model.arch 'exported' only"
        )
    if fmt == "safetensors":
        meta = {"input_shape": json.dumps(list(model.input_shape)),
                "num_classes": str(model.num_classes)}  # fmt: skip
        return Exported(encode_state(model.state, meta), ".safetensors", "application/octet-stream")
    if fmt == "torchscript":
        return Exported(to_torchscript(model), ".torchscript.pt", "application/octet-stream")
    if fmt == "onnx":
        return Exported(to_onnx(model), ".onnx", "application/octet-stream")
    if fmt == "hf":
        return Exported(to_hf_zip(model), ".hf.zip", "application/zip")
    raise ExportError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def to_torchscript(model: TrainedModel) -> bytes:
    module = model.module()
    with warnings.catch_warnings():
        # torch.jit is deprecated in favour of torch.export, but TorchScript archives are
        # what this format is: still loaded by libtorch (C++) and torch.jit.load
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, model.example_input(), check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
    return buf.getvalue()


def to_onnx(model: TrainedModel) -> bytes:
    module = model.module()
    batch = torch.export.Dim("batch", min=1, max=65536)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's FutureWarnings say nothing to buyers
        program = torch.onnx.export(
            module,
            (model.example_input(),),
            input_names=["input"],
            output_names=["output"],
            dynamic_shapes=({0: batch},),
            dynamo=True,
            verbose=False,
            report=False,
        )
    with tempfile.TemporaryDirectory(prefix="gpuflex-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        program.save(str(path))  # weights inline: a model under 2 GB is one file
        return path.read_bytes()


def write_hf_folder(model: TrainedModel, directory: Path) -> Path:
    """`config.json` + `model.safetensors` that `AutoModelForCausalLM` loads (trainer.hf_byte)."""
    reason = hf_refusal(model.spec)
    if reason:
        raise ExportError(reason)
    from trainer.hf_byte import ByteTransformerConfig, ByteTransformerForCausalLM

    config = ByteTransformerConfig(
        vocab_size=model.num_classes,
        seq_len=model.input_shape[0],
        d_model=model.spec.d_model,
        n_layers=model.spec.n_layers,
        n_heads=model.spec.n_heads,
    )
    with torch.random.fork_rng(devices=[]):
        hf = ByteTransformerForCausalLM(config)
    hf.model.load_state_dict(model.state)
    hf.save_pretrained(directory)
    return directory


def to_hf_zip(model: TrainedModel) -> bytes:
    with tempfile.TemporaryDirectory(prefix="gpuflex-hf-") as tmp:
        folder = write_hf_folder(model, Path(tmp))
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(folder.iterdir()):
                zf.write(path, path.name)
    return buf.getvalue()
