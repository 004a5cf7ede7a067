import pytest
import torch

from trainer.models import ModelSpecError, build_model, describe_model
from trainer.spec import ModelSpec


def test_mlp_parameters_and_flops_match_hand_count() -> None:
    model = build_model(ModelSpec(arch="mlp", hidden=[128]), (64,), 10)
    info = describe_model(model, (64,), integer_input=False)
    assert info.parameters == 64 * 128 + 128 + 128 * 10 + 10  # 9610
    assert info.flops_per_sample == 2 * (64 * 128 + 128 * 10)  # multiply-adds of both layers
    assert info.bytes_fp32 == 4 * 9610


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_conv_models_take_flat_square_digits_and_images(arch: str) -> None:
    spec = ModelSpec(arch=arch, channels=[8, 16])
    flat = build_model(spec, (64,), 10)
    assert flat(torch.zeros(3, 64)).shape == (3, 10)
    rgb = build_model(spec, (3, 16, 16), 4)
    assert rgb(torch.zeros(2, 3, 16, 16)).shape == (2, 4)
    assert describe_model(rgb, (3, 16, 16), integer_input=False).flops_per_sample > 0


def test_transformer_is_causal_and_predicts_bytes() -> None:
    spec = ModelSpec(arch="transformer", d_model=32, n_layers=2, n_heads=4)
    model = build_model(spec, (16,), 256).eval()
    x = torch.randint(0, 256, (2, 16))
    out = model(x)
    assert out.shape == (2, 16, 256)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256  # a later token must not change earlier outputs
    assert torch.allclose(model(changed)[:, :-1], out[:, :-1], atol=1e-5)


def test_same_seed_same_weights_and_no_integer_state() -> None:
    spec = ModelSpec(arch="resnet", channels=[8])
    a, b = build_model(spec, (64,), 10, seed=3), build_model(spec, (64,), 10, seed=3)
    for (ka, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(va, vb), ka
        assert va.is_floating_point(), ka


def test_model_that_does_not_fit_the_data_is_a_clear_error() -> None:
    with pytest.raises(ModelSpecError, match="image input"):
        build_model(ModelSpec(arch="cnn"), (10,), 3)
    with pytest.raises(ModelSpecError, match="token sequences"):
        build_model(ModelSpec(arch="transformer"), (1, 8, 8), 256)


def test_resnet_stages_follow_channels_like_resnet18() -> None:
    spec = ModelSpec(arch="resnet", channels=[64, 128, 256, 512], blocks=2)
    model = build_model(spec, (3, 32, 32), 10)
    info = describe_model(model, (3, 32, 32), integer_input=False)
    assert 11.0e6 < info.parameters < 11.3e6  # ResNet-18 for CIFAR: 11.17M
    sides = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, i, o: sides.append(o.shape[-1]))
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert sides == [32, 32, 16, 16, 8, 8, 4, 4]  # each stage after the first halves the side


def test_a_single_stage_resnet_keeps_its_layout() -> None:
    # one entry in `channels` is the original single-width ResNet: same keys, no shortcut convs
    model = build_model(ModelSpec(arch="resnet", channels=[8], blocks=2), (64,), 10)
    keys = {k.rsplit(".", 1)[0] for k in model.state_dict() if k.startswith("blocks.0.")}
    assert keys == {"blocks.0.conv1", "blocks.0.norm1", "blocks.0.conv2", "blocks.0.norm2"}


@pytest.mark.parametrize(
    ("spec", "shape", "x"),
    [
        (
            ModelSpec(arch="transformer", d_model=32, n_layers=3, n_heads=4, dropout=0.1),
            (16,),
            torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0)),
        ),
        (
            ModelSpec(arch="resnet", channels=[8, 16], blocks=2),
            (3, 16, 16),
            torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)),
        ),
    ],
    ids=["transformer", "resnet"],
)
def test_checkpointing_recomputes_blocks_with_the_same_gradients(spec, shape, x) -> None:
    classes = 256 if spec.arch == "transformer" else 10
    plain = build_model(spec, shape, classes, seed=1)
    ckpt = build_model(spec.model_copy(update={"checkpointing": True}), shape, classes, seed=1)
    calls = []
    ckpt.blocks[0].register_forward_pre_hook(lambda m, i: calls.append(1))
    grads = []
    for model in (plain, ckpt):
        torch.manual_seed(0)  # the same dropout masks
        model(x).float().pow(2).mean().backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    assert len(calls) == 2  # the block ran again in the backward pass
    for k, g in grads[0].items():
        assert torch.allclose(g, grads[1][k], atol=1e-6, rtol=1e-5), k
    calls.clear()
    ckpt.eval()
    with torch.no_grad():
        ckpt(x)
    assert len(calls) == 1  # evaluation is never checkpointed
