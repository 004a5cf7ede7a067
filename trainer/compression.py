"""Update compression: fp16, 8- and 4-bit block quantization, and top-k with error feedback.

Every codec flattens the update in sorted key order (one vector, so top-k is global and the
header stays a few entries), writes safetensors bytes, and states the error it may make:
`error_bound(codec, x)` is an elementwise bound on |x - decode(encode(x))|. Decoding checks
the payload against the global model it updates before trusting a single number, then hands
the result to the same `validate_update` every uncompressed update goes through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.aggregation.functions import flatten_state, unflatten_state
from trainer.updates import UpdateRejected, decode_state, encode_state, validate_update

CODECS = ("none", "fp16", "int8", "int4", "topk")
FP16_MAX = 65504.0
_FP16_REL = 2.0**-11  # round-to-nearest relative error of a normal fp16
_FP16_ABS = 2.0**-25  # half the smallest subnormal step


@dataclass(frozen=True)
class CodecConfig:
    name: str = "none"
    block_size: int = 256
    topk_fraction: float = 0.01

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ValueError(f"unknown codec '{self.name}'; choose one of {', '.join(CODECS)}")


@dataclass
class ErrorFeedback:
    """What top-k left out last time, added back before the next selection (a node's state)."""

    residual: Tensor | None = None


def encode_update(
    update: Mapping[str, Tensor],
    config: CodecConfig,
    feedback: ErrorFeedback | None = None,
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    meta = dict(metadata or {})
    if config.name == "none":
        return encode_state(update, {**meta, "codec": "none"})
    flat = flatten_state(update, torch.float32)
    if config.name == "topk" and feedback is not None and feedback.residual is not None:
        flat = flat + feedback.residual
    tensors, extra = _ENCODERS[config.name](flat, config)
    if config.name == "topk" and feedback is not None:
        sent = torch.zeros_like(flat)
        sent[tensors["indices"].long()] = tensors["values"].float()
        feedback.residual = flat - sent
    meta.update(extra)
    meta["codec"] = config.name
    meta["numel"] = str(flat.numel())
    return encode_state(tensors, meta)


def max_payload_bytes(reference: Mapping[str, Tensor]) -> int:
    """The most bytes an update of `reference` can take in any codec (the header, and 8
    bytes a value): a receiver refuses a longer body before reading it."""
    return 8 + 65536 + 8 * sum(t.numel() for t in reference.values())


def decode_any(
    data: bytes, reference: Mapping[str, Tensor], max_norm: float | None = None
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Decode an update in whatever codec its metadata names, validated against `reference`."""
    numel = sum(t.numel() for t in reference.values())
    limit = max_payload_bytes(reference)
    if len(data) > limit:
        raise UpdateRejected("corrupt", f"payload of {len(data)} bytes exceeds {limit} bytes")
    tensors, meta = decode_state(data)
    codec = meta.get("codec", "none")
    if codec == "none":
        update = tensors
    elif codec in _DECODERS:
        if meta.get("numel") != str(numel):
            raise UpdateRejected(
                "shape", f"payload encodes {meta.get('numel')} values, the model has {numel}"
            )
        flat = _DECODERS[codec](tensors, meta, numel)
        update = unflatten_state(flat, reference)
    else:
        raise UpdateRejected("metadata", f"unknown codec '{codec}' in the payload")
    validate_update(update, reference, max_norm)
    return update, meta


def error_bound(codec: CodecConfig, update: Mapping[str, Tensor]) -> Tensor:
    """Elementwise bound on the decoding error, flattened like the payload (sorted keys)."""
    x = flatten_state(update, torch.float32)
    if codec.name == "none":
        return torch.zeros_like(x)
    if codec.name == "fp16":
        return x.abs() * _FP16_REL + _FP16_ABS
    if codec.name in ("int8", "int4"):
        levels = 127 if codec.name == "int8" else 7
        blocks, _ = _blocks(x, codec.block_size)
        # half a quantization step, plus the scale's own fp32 rounding
        step = blocks.abs().amax(dim=1, keepdim=True) / levels
        bound = (step / 2 + step * 2**-20).expand_as(blocks).reshape(-1)[: x.numel()]
        return bound
    k = _topk_count(x.numel(), codec.topk_fraction)
    kth = x.abs().topk(k).values[-1]
    # dropped entries are at most the k-th magnitude; kept ones carry fp16 rounding
    return torch.maximum(kth.expand_as(x), x.abs() * _FP16_REL + _FP16_ABS)


# ------------------------------------------------------------------------------ codecs


def _encode_fp16(flat: Tensor, config: CodecConfig) -> tuple[dict[str, Tensor], dict[str, str]]:
    if flat.abs().max() > FP16_MAX:
        raise ValueError("update has values beyond fp16 range; use another codec")
    return {"values": flat.to(torch.float16)}, {}


def _decode_fp16(tensors: dict[str, Tensor], meta: dict[str, str], numel: int) -> Tensor:
    values = _expect(tensors, "values", torch.float16, (numel,))
    return values.float()


def _blocks(flat: Tensor, block: int) -> tuple[Tensor, int]:
    pad = (-flat.numel()) % block
    return torch.nn.functional.pad(flat, (0, pad)).view(-1, block), pad


def _quantize(flat: Tensor, config: CodecConfig, levels: int) -> tuple[Tensor, Tensor]:
    blocks, _ = _blocks(flat, config.block_size)
    scales = blocks.abs().amax(dim=1) / levels
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / safe[:, None]).clamp(-levels, levels).to(torch.int8)
    return q, scales


def _encode_int8(flat: Tensor, config: CodecConfig) -> tuple[dict[str, Tensor], dict[str, str]]:
    q, scales = _quantize(flat, config, 127)
    return {"q": q.reshape(-1), "scales": scales}, {"block": str(config.block_size)}


def _encode_int4(flat: Tensor, config: CodecConfig) -> tuple[dict[str, Tensor], dict[str, str]]:
    q, scales = _quantize(flat, config, 7)
    nibbles = (q.reshape(-1) + 8).to(torch.uint8)  # 1..15; two per byte
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, torch.full((1,), 8, dtype=torch.uint8)])
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return {"q": packed, "scales": scales}, {"block": str(config.block_size)}


def _block_meta(meta: dict[str, str], numel: int) -> tuple[int, int]:
    try:
        block = int(meta["block"])
    except (KeyError, ValueError):
        raise UpdateRejected("metadata", "quantized payload without a valid 'block'") from None
    if not 8 <= block <= 65536:
        raise UpdateRejected("metadata", f"block size {block} out of range")
    return block, math.ceil(numel / block)


def _dequantize(q: Tensor, scales: Tensor, numel: int) -> Tensor:
    if not torch.isfinite(scales).all() or (scales < 0).any():
        raise UpdateRejected("non_finite", "quantization scales must be finite and non-negative")
    return (q.float().view(scales.numel(), -1) * scales[:, None]).reshape(-1)[:numel]


def _decode_int8(tensors: dict[str, Tensor], meta: dict[str, str], numel: int) -> Tensor:
    block, nblocks = _block_meta(meta, numel)
    q = _expect(tensors, "q", torch.int8, (nblocks * block,))
    scales = _expect(tensors, "scales", torch.float32, (nblocks,))
    return _dequantize(q, scales, numel)


def _decode_int4(tensors: dict[str, Tensor], meta: dict[str, str], numel: int) -> Tensor:
    block, nblocks = _block_meta(meta, numel)
    packed = _expect(tensors, "q", torch.uint8, (math.ceil(nblocks * block / 2),))
    scales = _expect(tensors, "scales", torch.float32, (nblocks,))
    nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[: nblocks * block]
    if (nibbles == 0).any():
        raise UpdateRejected("corrupt", "4-bit payload holds a code outside -7..7")
    return _dequantize(nibbles.to(torch.int8) - 8, scales, numel)


def _topk_count(numel: int, fraction: float) -> int:
    return max(1, min(numel, math.ceil(fraction * numel)))


def _encode_topk(flat: Tensor, config: CodecConfig) -> tuple[dict[str, Tensor], dict[str, str]]:
    k = _topk_count(flat.numel(), config.topk_fraction)
    idx = flat.abs().topk(k).indices.sort().values
    if flat[idx].abs().max() > FP16_MAX:
        raise ValueError("update has values beyond fp16 range; use another codec")
    return {"indices": idx.to(torch.int32), "values": flat[idx].to(torch.float16)}, {}


def _decode_topk(tensors: dict[str, Tensor], meta: dict[str, str], numel: int) -> Tensor:
    idx = tensors.get("indices")
    if idx is None or idx.dtype != torch.int32 or idx.dim() != 1 or not 0 < idx.numel() <= numel:
        raise UpdateRejected("corrupt", "top-k payload needs 1-D int32 'indices'", "indices")
    values = _expect(tensors, "values", torch.float16, (idx.numel(),))
    if idx.min() < 0 or idx.max() >= numel:
        raise UpdateRejected("corrupt", f"top-k index outside 0..{numel - 1}", "indices")
    if idx.numel() > 1 and not (idx[1:] > idx[:-1]).all():
        raise UpdateRejected("corrupt", "top-k indices must be strictly increasing", "indices")
    flat = torch.zeros(numel)
    flat[idx.long()] = values.float()
    return flat


def _expect(tensors: dict[str, Tensor], name: str, dtype: torch.dtype, shape: tuple) -> Tensor:
    t = tensors.get(name)
    if t is None:
        raise UpdateRejected("missing_keys", f"compressed payload lacks tensor '{name}'", name)
    if t.dtype != dtype:
        raise UpdateRejected("dtype", f"tensor '{name}' has dtype {t.dtype}, expected {dtype}")
    if tuple(t.shape) != shape:
        raise UpdateRejected(
            "shape", f"tensor '{name}' has shape {list(t.shape)}, expected {list(shape)}", name
        )
    return t


_ENCODERS = {
    "fp16": _encode_fp16,
    "int8": _encode_int8,
    "int4": _encode_int4,
    "topk": _encode_topk,
}
_DECODERS = {
    "fp16": _decode_fp16,
    "int8": _decode_int8,
    "int4": _decode_int4,
    "topk": _decode_topk,
}
