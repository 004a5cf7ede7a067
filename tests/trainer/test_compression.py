import pytest
import torch

from trainer.aggregation.functions import flatten_state
from trainer.compression import CodecConfig, ErrorFeedback, decode_any, encode_update, error_bound
from trainer.updates import UpdateRejected, decode_state, encode_state


def _update(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(37, 11, generator=g) * 0.01,
        "a.bias": torch.randn(37, generator=g),
        "b.weight": torch.randn(5, 3, 3, generator=g) * 3,
    }


REFERENCE = {k: torch.zeros_like(v) for k, v in _update().items()}
CODECS = [
    CodecConfig("none"),
    CodecConfig("fp16"),
    CodecConfig("int8", block_size=64),
    CodecConfig("int4", block_size=32),
    CodecConfig("topk", topk_fraction=0.1),
]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_round_trip_stays_within_the_stated_bound(codec: CodecConfig) -> None:
    for seed in range(5):
        update = _update(seed)
        decoded, meta = decode_any(encode_update(update, codec), REFERENCE)
        assert meta["codec"] == codec.name
        err = (flatten_state(update) - flatten_state(decoded)).abs()
        assert (err <= error_bound(codec, update)).all()


def test_compressed_payloads_are_smaller_in_the_expected_order() -> None:
    sizes = {c.name: len(encode_update(_update(), c)) for c in CODECS}
    assert sizes["none"] > sizes["fp16"] > sizes["int8"] > sizes["int4"] > sizes["topk"]
    big = {"w": torch.randn(100_000)}
    int4 = len(encode_update(big, CodecConfig("int4", block_size=256)))
    assert int4 < 0.55 * 100_000  # half a byte per value plus scales and header


def test_error_feedback_carries_what_topk_left_out() -> None:
    codec = CodecConfig("topk", topk_fraction=0.05)
    feedback = ErrorFeedback()
    update = _update()
    total_sent = torch.zeros(sum(t.numel() for t in update.values()))
    for _ in range(40):  # the same update repeatedly: over time every coordinate gets through
        decoded, _ = decode_any(encode_update(update, codec, feedback), REFERENCE)
        total_sent += flatten_state(decoded)
    mean_sent = total_sent / 40
    assert torch.allclose(mean_sent, flatten_state(update), atol=0.2)
    assert feedback.residual is not None


def _tamper(payload: bytes, **replace: torch.Tensor) -> bytes:
    tensors, meta = decode_state(payload)
    tensors.update(replace)
    return encode_state(tensors, meta)


def test_corrupted_payloads_are_rejected_with_reasons() -> None:
    int8 = encode_update(_update(), CodecConfig("int8", block_size=64))
    tensors, _ = decode_state(int8)
    bad_scales = tensors["scales"].clone()
    bad_scales[0] = float("nan")
    with pytest.raises(UpdateRejected, match="scales") as info:
        decode_any(_tamper(int8, scales=bad_scales), REFERENCE)
    assert info.value.reason == "non_finite"
    with pytest.raises(UpdateRejected) as info:
        decode_any(_tamper(int8, q=tensors["q"][:-5]), REFERENCE)
    assert info.value.reason == "shape"

    topk = encode_update(_update(), CodecConfig("topk", topk_fraction=0.1))
    t, _ = decode_state(topk)
    out_of_range = t["indices"].clone()
    out_of_range[-1] = 10**6
    with pytest.raises(UpdateRejected, match="outside"):
        decode_any(_tamper(topk, indices=out_of_range), REFERENCE)
    unsorted = t["indices"].flip(0).contiguous()
    with pytest.raises(UpdateRejected, match="increasing"):
        decode_any(_tamper(topk, indices=unsorted), REFERENCE)

    with pytest.raises(UpdateRejected) as info:
        decode_any(topk[: len(topk) // 2], REFERENCE)
    assert info.value.reason == "corrupt"


def test_payload_for_another_model_is_rejected() -> None:
    payload = encode_update(_update(), CodecConfig("int4", block_size=32))
    smaller = {"a.weight": torch.zeros(37, 11)}
    with pytest.raises(UpdateRejected, match="values, the model has"):
        decode_any(payload, smaller)


def test_decoded_updates_still_pass_the_norm_bound() -> None:
    payload = encode_update(_update(), CodecConfig("fp16"))
    with pytest.raises(UpdateRejected) as info:
        decode_any(payload, REFERENCE, max_norm=1.0)
    assert info.value.reason == "norm"


def test_unknown_codec_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown codec 'zip'"):
        CodecConfig("zip")
