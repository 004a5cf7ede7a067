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
