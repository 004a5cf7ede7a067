"""Each export format read back by its own library, and its outputs compared with PyTorch's."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.export import ExportError, TrainedModel, export_model
from trainer.models import build_model
from trainer.spec import ModelSpec
from trainer.updates import decode_state

MODELS = {
    "mlp": (ModelSpec(arch="mlp", hidden=[16]), (64,), 10),
    "cnn": (ModelSpec(arch="cnn", channels=[4, 8]), (1, 8, 8), 10),
    "transformer": (ModelSpec(arch="transformer", d_model=16, n_heads=2, n_layers=1), (12,), 256),
}


def trained(arch: str) -> TrainedModel:
    spec, shape, classes = MODELS[arch]
    # seed 7, not the export's own rebuild seed: the export must load these weights
    state = build_model(spec, shape, classes, seed=7).state_dict()
    return TrainedModel(state, spec, shape, classes)


def reference(model: TrainedModel, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.module()(x).numpy()


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_onnx_runs_in_onnxruntime_like_pytorch(arch: str) -> None:
    import onnx
    import onnxruntime as ort

    model = trained(arch)
    data = export_model(model, "onnx").data
    onnx.checker.check_model(onnx.load_from_string(data))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = model.example_input(batch=5)  # another batch size than the export traced
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(out, reference(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_torchscript_loads_with_torch_jit(arch: str) -> None:
    model = trained(arch)
    data = export_model(model, "torchscript").data
    loaded = torch.jit.load(io.BytesIO(data))
    x = model.example_input()
    with torch.no_grad():
        np.testing.assert_allclose(loaded(x).numpy(), reference(model, x), rtol=1e-5, atol=1e-6)


def test_safetensors_reads_back_with_safetensors() -> None:
    from safetensors.torch import load

    model = trained("mlp")
    data = export_model(model, "safetensors").data
    tensors = load(data)
    assert tensors.keys() == model.state.keys()
    assert all(torch.equal(tensors[k], model.state[k]) for k in tensors)
    assert TrainedModel.from_bytes(data, model.spec).input_shape == (64,)
    assert decode_state(data)[1]["num_classes"] == "10"


def test_hf_folder_loads_with_transformers(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    import trainer.hf_byte  # noqa: F401  (registers the architecture with the Auto classes)

    model = trained("transformer")
    with zipfile.ZipFile(io.BytesIO(export_model(model, "hf").data)) as zf:
        assert sorted(zf.namelist()) == ["config.json", "model.safetensors"]
        zf.extractall(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).seq_len == 12
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = model.example_input()
    with torch.no_grad():
        logits = loaded(input_ids=x).logits.numpy()
    np.testing.assert_allclose(logits, reference(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_hf_refuses_architectures_without_a_transformers_model(arch: str) -> None:
    with pytest.raises(ExportError, match=f"model.arch '{arch}'"):
        export_model(trained(arch), "hf")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ExportError, match="unknown format 'pickle'"):
        export_model(trained("mlp"), "pickle")
