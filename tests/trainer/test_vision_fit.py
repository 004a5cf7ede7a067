"""ResNet-18 and ViT-S of real size, and the memory estimate a node checks before it works."""

from __future__ import annotations

import pytest
import torch

from trainer.datasets import Dataset
from trainer.fit import (
    CUDA_OVERHEAD_BYTES,
    Footprint,
    check_task,
    estimate_memory,
    fits,
    measure_footprint,
)
from trainer.local import train_local
from trainer.models import ModelSpecError, build_model, model_size
from trainer.spec import ModelSpec, parse_spec

IMAGE = (3, 16, 16)


def _images(n: int = 8) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *IMAGE, generator=g), torch.randint(0, 4, (n,), generator=g)
    return Dataset(name="img", task="classification", x_train=x, y_train=y, x_test=x[:2],
                   y_test=y[:2], num_classes=4, input_shape=IMAGE)  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "params"),
    # torchvision's resnet18 has 11.69M with 1000 classes (512*1000 of them the head), timm's
    # vit_small_patch16_224 22.05M: the same bodies, with a 4-class head and 16x16 images here
    [("resnet18", 11_170_000), ("vit_s", 21_300_000)],
)
def test_real_size_vision_models_build_and_train_one_step(arch: str, params: int) -> None:
    spec = parse_spec({"name": "v", "model": {"arch": arch, "patch_size": 4},
                       "local": {"steps": 1, "batch_size": 4}})  # fmt: skip
    model = build_model(spec.model, IMAGE, 4, seed=0)
    count = sum(p.numel() for p in model.parameters())
    assert params <= count < params * 1.01
    assert all(t.is_floating_point() for t in model.state_dict().values())  # no BatchNorm
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result = train_local(model, state, _images(), spec, seed=1)
    assert result.steps == 1 and torch.isfinite(torch.tensor(result.loss))
    assert any(float(d.abs().max()) > 0 for d in result.delta.values())


def test_vit_needs_patches_that_tile_the_image_and_resnet18_its_imagenet_stem() -> None:
    with pytest.raises(ModelSpecError, match="patch_size"):
        build_model(ModelSpec(arch="vit_s", patch_size=5), IMAGE, 4)
    big = build_model(ModelSpec(arch="resnet18"), (3, 64, 64), 10)
    assert big.conv1.kernel_size == (7, 7)  # torchvision's stem on images of ImageNet scale
    assert big(torch.zeros(1, 3, 64, 64)).shape == (1, 10)


def test_vision_checkpoint_loads_exactly() -> None:
    spec = ModelSpec(arch="resnet18")
    trained = build_model(spec, IMAGE, 4, seed=5).eval()
    loaded = build_model(spec, IMAGE, 4, seed=0, weights=trained.state_dict()).eval()
    x = torch.randn(2, *IMAGE)
    assert torch.equal(loaded(x), trained(x))
    with pytest.raises(ModelSpecError, match="checkpoint"):
        build_model(spec, IMAGE, 4, weights={"fc.weight": torch.zeros(4, 512)})


def test_footprint_counts_weights_gradients_optimizer_and_activations() -> None:
    spec = ModelSpec(arch="resnet18")
    fp = measure_footprint(spec, IMAGE, 4)
    params, nbytes = model_size(spec, IMAGE, 4)
    assert fp.parameters == fp.trainable == params and fp.state_bytes == nbytes
    assert fp.activation_bytes > 0
    sgd = estimate_memory(fp, optimizer="sgd", batch_size=32)
    adam = estimate_memory(fp, optimizer="adamw", batch_size=32)
    assert sgd.optimizer == 0 and adam.optimizer == 8 * fp.trainable
    assert adam.activations == 32 * fp.activation_bytes
    half = estimate_memory(fp, optimizer="adamw", batch_size=32, grad_accum_steps=2)
    assert half.activations == 16 * fp.activation_bytes
    gpu = estimate_memory(fp, optimizer="adamw", batch_size=32, gpu=True)
    assert gpu.total == adam.total + CUDA_OVERHEAD_BYTES
    assert fits(adam, 2 * adam.total) and not fits(adam, adam.total // 2)


def test_check_task_rejects_a_task_too_big_for_the_free_memory() -> None:
    fp = Footprint(parameters=10**9, trainable=10**9, state_bytes=4 * 10**9,
                   activation_bytes=10**6)  # fmt: skip
    task = {"footprint": fp.to_dict(), "batch_size": 8,
            "spec": {"optimizer": {"name": "adamw"}, "local": {"batch_size": 32}}}  # fmt: skip
    reason = check_task(task, free_bytes=8 * 2**30, gpu=True)
    assert reason is not None and "GPU memory" in reason
    assert check_task(task, free_bytes=64 * 2**30, gpu=True) is None
    assert check_task({"spec": {}}, free_bytes=1, gpu=False) is None  # no footprint: no verdict
