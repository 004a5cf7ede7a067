"""Model delivery: how a node gets a round's global model without downloading it whole.

Jobs with a delivery codec (`compression.download_codec`) keep a canonical chain of models.
Round r's model is round r-1's plus the round's aggregated step encoded with that codec, and
what the encoding left out is carried into the next round's step (error feedback, so the
chain never drifts from the aggregate). Because the coordinator itself adopts the decoded
step, a node that holds round r-1's model rebuilds round r's bit for bit from the small delta
payload and can check it against the round's model hash, exactly as a full download is
checked; replicas of a task still start from the same model. Round 1's model is a pure
function of the spec and seed (trainer.models.build_model), so a node builds it itself.

Adding a decoded delta is elementwise float32 arithmetic on the CPU, the same on every
machine with the same inputs; a node that still ends up with another hash (another torch,
a corrupt cache) is caught by the hash check and fetches the whole model instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from trainer.compression import CodecConfig, decode_any, encode_update
from trainer.delivery_codec import delivery_codec_name
from trainer.hashing import state_hash
from trainer.spec import JobSpec

State = dict[str, torch.Tensor]

DELTA_CODECS = ("fp16", "int8")


def delivery_codec(spec: JobSpec) -> CodecConfig | None:
    """The codec of a job's model deltas (trainer.delivery_codec's rule), or None: nodes
    download each round's model whole."""
    name = delivery_codec_name(spec)
    return None if name == "none" else CodecConfig(name, spec.compression.block_size)


@dataclass(frozen=True)
class DeliveredStep:
    state: State  # the new canonical model: what every node rebuilds
    payload: bytes  # the delta from the base model, as nodes download it
    residual: State  # what the payload left out, carried into the next step


def apply_delta(base: Mapping[str, torch.Tensor], payload: bytes) -> State:
    """The model a delta payload leads to from `base`: the one computation both the
    coordinator and every node run, so that their results agree bit for bit."""
    step, _ = decode_any(payload, base)
    return {k: (base[k] + step[k]).to(base[k].dtype) for k in base}


def deliver_step(
    base: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    codec: CodecConfig,
    residual: Mapping[str, torch.Tensor] | None = None,
) -> DeliveredStep:
    """Encode the step from `base` to `target` (plus the carried `residual`) with `codec`,
    and adopt what the nodes will decode as the new model."""
    carried = residual or {}
    step = {k: target[k].float() - base[k].float() + carried.get(k, 0.0) for k in base}
    payload = encode_update(step, codec, metadata={"delivery": "delta", "base": state_hash(base)})
    state = apply_delta(base, payload)
    left = {k: (target[k].float() + carried.get(k, 0.0)) - state[k].float() for k in base}
    return DeliveredStep(state, payload, left)
