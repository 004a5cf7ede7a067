"""Encoding and validation of model states and updates (trainer.updates)."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
import torch

from trainer.updates import (
    FORMAT,
    UpdateRejected,
    apply_delta,
    decode_state,
    decode_update,
    delta,
    encode_state,
    update_norm,
    validate_update,
)


def reference() -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.zeros(3, 4),
        "layer.bias": torch.zeros(3),
        "head.weight": torch.zeros(2, 3, dtype=torch.float64),
    }


def good_update() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        name: torch.randn(t.shape, generator=gen, dtype=t.dtype) for name, t in reference().items()
    }


def rejected(excinfo: pytest.ExceptionInfo[UpdateRejected], reason: str, tensor: str) -> None:
    """The rejection has the expected code and its message names the offending tensor."""
    assert excinfo.value.reason == reason, str(excinfo.value)
    assert f"'{tensor}'" in str(excinfo.value), str(excinfo.value)


def with_header(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


# ------------------------------------------------------------------------ round trips


def test_round_trip_is_exact_for_every_float_dtype() -> None:
    state = {
        "a": torch.randn(5, 7),
        "b": torch.randn(3, dtype=torch.float64),
        "c": torch.randn(2, 2).to(torch.float16),
        "d": torch.randn(4).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    data = encode_state(state, {"round": "7"})
    out, meta = decode_state(data)
    assert meta == {"round": "7", "format": FORMAT}
    assert out.keys() == state.keys()
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype
        assert out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor), name


def test_encode_handles_non_contiguous_tied_and_grad_tensors() -> None:
    base = torch.randn(4, 6, requires_grad=True)
    state = {"t": base.detach().t(), "tied_a": base, "tied_b": base, "row": base.detach()[1]}
    out, _ = decode_state(encode_state(state))
    assert torch.equal(out["t"], base.detach().t())
    assert torch.equal(out["tied_a"], base.detach())
    assert torch.equal(out["tied_b"], base.detach())
    assert torch.equal(out["row"], base.detach()[1])


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="'x'"):
        encode_state({"x": [1.0, 2.0]})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reserved"):
        encode_state({"x": torch.zeros(1)}, {"format": "other"})
    with pytest.raises(TypeError, match="str to str"):
        encode_state({"x": torch.zeros(1)}, {"round": 3})  # type: ignore[dict-item]


def test_decode_update_accepts_a_good_update() -> None:
    update = good_update()
    out, meta = decode_update(encode_state(update, {"node": "n1"}), reference(), max_norm=100.0)
    assert meta["node"] == "n1"
    for name in update:
        assert torch.equal(out[name], update[name])


# ------------------------------------------------------------------------- rejections


def test_wrong_shape() -> None:
    update = good_update()
    update["layer.bias"] = torch.zeros(4)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "shape", "layer.bias")


def test_wrong_dtype() -> None:
    update = good_update()
    update["layer.weight"] = update["layer.weight"].double()
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "dtype", "layer.weight")


def test_integer_tensor_is_a_dtype_rejection() -> None:
    update = good_update()
    update["layer.bias"] = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "dtype", "layer.bias")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite(bad: float) -> None:
    update = good_update()
    update["head.weight"][1, 2] = bad
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "non_finite", "head.weight")


def test_oversized_norm_names_the_largest_tensor() -> None:
    update = {name: torch.zeros_like(t) for name, t in reference().items()}
    update["layer.weight"][0, 0] = 3.0
    update["layer.bias"][0] = 4.0  # global norm 5, largest part layer.bias
    decode_update(encode_state(update), reference(), max_norm=5.0)  # at the limit: fine
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference(), max_norm=4.99)
    rejected(exc, "norm", "layer.bias")


def test_missing_key() -> None:
    update = good_update()
    del update["layer.bias"]
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "missing_keys", "layer.bias")


def test_unexpected_key() -> None:
    update = good_update()
    update["sneaky.extra"] = torch.zeros(1)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "unexpected_keys", "sneaky.extra")


def test_validate_update_works_on_tensors_directly() -> None:
    update = good_update()
    validate_update(update, reference(), None)
    update["layer.weight"] = torch.full((3, 4), math.nan)
    with pytest.raises(UpdateRejected) as exc:
        validate_update(update, reference(), None)
    rejected(exc, "non_finite", "layer.weight")
    with pytest.raises(ValueError, match="max_norm"):
        validate_update(good_update(), reference(), 0.0)


def test_truncated_bytes() -> None:
    data = encode_state(good_update())
    with pytest.raises(UpdateRejected) as exc:
        decode_update(data[:-5], reference())
    # the last tensor in the payload is the one whose data runs past the end
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    rejected(exc, "corrupt", last)
    with pytest.raises(UpdateRejected) as exc:
        decode_state(data[:-5])
    rejected(exc, "corrupt", last)


def test_truncated_inside_header() -> None:
    data = encode_state(good_update())
    for cut in (0, 5, 20):
        with pytest.raises(UpdateRejected) as exc:
            decode_state(data[:cut])
        assert exc.value.reason == "corrupt"


def test_garbage_bytes() -> None:
    garbage = bytes(range(256)) * 4
    with pytest.raises(UpdateRejected) as exc:
        decode_state(garbage)
    assert exc.value.reason == "corrupt"
    assert "header" in str(exc.value)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(garbage, reference())
    assert exc.value.reason == "corrupt"


def test_header_length_larger_than_payload() -> None:
    data = encode_state(good_update())
    forged = (len(data) * 10).to_bytes(8, "little") + data[8:]
    with pytest.raises(UpdateRejected) as exc:
        decode_state(forged)
    assert exc.value.reason == "corrupt"
    assert "exceeds the payload" in str(exc.value)


def test_bad_json_header() -> None:
    raw = b'{"a": {"dtype": "F32"'  # unterminated
    with pytest.raises(UpdateRejected) as exc:
        decode_state(len(raw).to_bytes(8, "little") + raw)
    assert exc.value.reason == "corrupt"
    deep = b"[" * 100_000 + b"]" * 100_000  # recursion bomb
    with pytest.raises(UpdateRejected) as exc:
        decode_state(len(deep).to_bytes(8, "little") + deep)
    assert exc.value.reason == "corrupt"


def test_declared_size_inconsistent_with_offsets() -> None:
    header = {
        "__metadata__": {"format": FORMAT},
        "layer.bias": {"dtype": "F32", "shape": [1_000_000_000], "data_offsets": [0, 12]},
    }
    with pytest.raises(UpdateRejected) as exc:
        decode_state(with_header(header, bytes(12)))
    rejected(exc, "corrupt", "layer.bias")


def test_unknown_dtype_in_header() -> None:
    header = {
        "__metadata__": {"format": FORMAT},
        "layer.bias": {"dtype": "F128", "shape": [3], "data_offsets": [0, 48]},
    }
    with pytest.raises(UpdateRejected) as exc:
        decode_state(with_header(header, bytes(48)))
    rejected(exc, "corrupt", "layer.bias")


def test_huge_declared_tensor_is_rejected_from_the_header() -> None:
    # a well-formed payload for a 10x larger bias: refused by shape, before any tensor is built
    update = good_update()
    update["layer.bias"] = torch.zeros(30)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(update), reference())
    rejected(exc, "shape", "layer.bias")


def test_payload_much_larger_than_the_model_is_rejected_before_parsing() -> None:
    big = {"layer.weight": torch.zeros(1000, 1000)}
    with pytest.raises(UpdateRejected) as exc:
        decode_update(encode_state(big), reference())
    assert exc.value.reason == "corrupt"
    assert "larger than any valid update" in str(exc.value)


def test_missing_or_foreign_format_is_a_metadata_rejection() -> None:
    import safetensors.torch

    foreign = safetensors.torch.save({"layer.bias": torch.zeros(3)})
    with pytest.raises(UpdateRejected) as exc:
        decode_state(foreign)
    assert exc.value.reason == "metadata"
    header = {
        "__metadata__": {"format": 3},
        "x": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
    }
    with pytest.raises(UpdateRejected) as exc:
        decode_state(with_header(header, bytes(4)))
    assert exc.value.reason == "metadata"


class _Boom:
    """Unpickling this creates a file: proof that a payload ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def test_pickle_payload_is_rejected_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"layer.bias": _Boom(marker)})
    pickle.loads(payload).get("layer.bias").close()  # the payload is live: it does run code
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UpdateRejected) as exc:
        decode_state(payload)
    assert exc.value.reason == "corrupt"
    with pytest.raises(UpdateRejected) as exc:
        decode_update(payload, reference())
    assert exc.value.reason == "corrupt"
    assert not marker.exists()


def test_torch_save_payload_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(good_update(), path)
    with pytest.raises(UpdateRejected) as exc:
        decode_update(path.read_bytes(), reference())
    assert exc.value.reason == "corrupt"


# ------------------------------------------------------------------------ arithmetic


def test_update_norm_delta_apply_delta() -> None:
    global_ = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.5]], dtype=torch.float64)}
    local = {"a": torch.tensor([4.0, 6.0]), "b": torch.tensor([[0.5]], dtype=torch.float64)}
    d = delta(local, global_)
    assert torch.equal(d["a"], torch.tensor([3.0, 4.0]))
    assert update_norm(d) == 5.0  # sqrt(3² + 4² + 0²)
    # global + 0.5 * delta = [1 + 1.5, 2 + 2] = [2.5, 4]
    new = apply_delta(global_, d, scale=0.5)
    assert torch.equal(new["a"], torch.tensor([2.5, 4.0]))
    assert new["b"].dtype == torch.float64
    assert torch.equal(global_["a"], torch.tensor([1.0, 2.0]))  # input untouched
    with pytest.raises(ValueError, match="key mismatch"):
        delta({"a": local["a"]}, global_)
    with pytest.raises(ValueError, match="'a'"):
        apply_delta(global_, {"a": torch.zeros(3), "b": d["b"]})


def test_apply_delta_keeps_the_global_dtype() -> None:
    # a float64 aggregate applied to a float32 model: summed in float64, rounded once
    g = {"a": torch.tensor([1.0], dtype=torch.float32)}
    d = {"a": torch.tensor([0.75e-7], dtype=torch.float64)}
    expected = torch.tensor([1.0 + 0.75e-7], dtype=torch.float64).to(torch.float32)
    assert torch.equal(apply_delta(g, d)["a"], expected)
    assert apply_delta(g, d)["a"].dtype == torch.float32


def test_deep_header_is_rejected_in_a_small_stack_thread() -> None:
    """Server threads have small stacks: the nesting check must come before the C parser."""
    import threading

    deep = b"[" * 50_000 + b"]" * 50_000
    outcome: list[str] = []

    def decode() -> None:
        try:
            decode_state(len(deep).to_bytes(8, "little") + deep)
        except UpdateRejected as exc:
            outcome.append(exc.reason)

    old = threading.stack_size(256 * 1024)
    try:
        worker = threading.Thread(target=decode)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(old)
    assert outcome == ["corrupt"]
