"""Do two replicas of one task agree? The distance between their updates, and the rule.

Replicas run the same task (global model, shard, seed, steps, batch) on different nodes, and
possibly in different precisions: fp32 on a CPU, bf16 autocast on recent GPUs, fp16 on older
ones (trainer.local.resolve_precision). Each node states the precision it ran in its upload's
metadata; the claim is self-reported, so the rule must hold whatever a cheater claims.

What bench/replica_divergence.py measured (digits MLP and CNN, a byte transformer on Python
source with AdamW; 1 epoch of one of 4 shards, 12 and 44 steps; from the initial model and
after 3 to 8 FedAvg rounds; after the int8 codec round trip), as relative L2 distance
|a - b| / max(|a|, |b|) over the whole update:

    the same task twice on one device                0 (identical bits)
    fp32 vs fp64 training (fp32's own rounding)      at most 6e-4
    honest fp32 vs bf16, fp32 vs fp16, bf16 vs fp16  MLP 0.003-0.013, transformer 0.016-0.035,
                                                     CNN 0.05-0.134 (cosine >= 0.991)
    a CPU's fp32/bf16 vs an H200's fp32 (TF32),      MLP 0.002-0.013, transformer 0.004-0.035,
      bf16 and fp16 (`--device cuda`, lent GPU)      CNN 0.04-0.158 (cosine >= 0.987)
    cheats against an honest replica                 another shard's update 0.36-0.92,
                                                     last round's update of the shard 0.58-1.17,
                                                     scaled x2 or x0.5 0.50, zero 1.0,
                                                     noise of the same norm 1.40, sign flip 2.0

Hence the rule: the whole update's relative L2 distance, at most CROSS_DEVICE_TOLERANCE for
replicas that may have run on different devices. Two things it deliberately does not do:

- No per-tensor tolerance. Honest replicas differ by up to 0.99 in single tensors: the
  attention's key bias gets no gradient in exact arithmetic (softmax ignores a constant added
  to every key), so its update is rounding noise, which Adam scales up to full-size steps. A
  per-tensor bound loose enough for that (at least sqrt(2), independent noise) catches
  nothing the whole-update bound misses. `Distance.per_tensor` is kept for diagnosis.
- The precision claim never tightens the rule by default. A cheater claims whichever class
  helps it, so the cross-class tolerance alone must catch the cheats (it does, above); and a
  shared claim does not mean shared numerics: trainer.local runs "fp32" on CUDA with TF32
  matmuls (fp16's 10-bit mantissa, like the fp32 vs fp16 row), and GPUs of different models
  pick different kernels. Identical bits are only to be expected from one kind of device and
  software, so a fleet known to be that homogeneous can pass `same_class_tolerance`
  (settings.GPUFLEX["AGREEMENT_TOLERANCE"], e.g. SAME_DEVICE_TOLERANCE) to hold replicas that
  claim the same class to it; differing claims always get at least CROSS_DEVICE_TOLERANCE.

What still passes: an update within 25% of the honest one, e.g. the honest update scaled by
0.8 to 1.33, which needs the work done anyway. Longer local work narrows the margin: training
longer converges toward the shard's own optimum, so another shard's update or another seed's
comes closer (a one-off run of the CNN at 16 epochs per task: another shard's update 0.43
away, the same shard with another seed 0.23). And an fp16 replica whose gradient scaler skips
a step that an fp32 or bf16 replica takes differs by about as much as a copied update (the CNN
at 4 epochs, `--long`: 0.48) and no tolerance tells them apart; train_local therefore starts
fp16's loss scale at 2^10, where torch's 2^16 overflowed on the first step (after that fix the
same `--long` run: fp16 skipped nothing, 0.07 from fp32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.updates import UpdateRejected

PRECISIONS = ("fp32", "bf16", "fp16")
# What an upload without a "precision" key ran: agents before mixed precision trained fp32.
DEFAULT_PRECISION = "fp32"

# Replicas that may have run on different devices or precisions: above the largest honest
# distance measured (0.158, the CNN, a CPU's fp32 against an H200's bf16) and below the
# smallest cheat (0.355, another shard's update to the transformer at round 0), a factor of
# 1.6 and 1.4 away (bench/replica_divergence.py, bench/results/divergence-h200.json; the
# module docstring has the table).
CROSS_DEVICE_TOLERANCE = 0.25
# Replicas on one kind of device and software: identical bits, and int8 quantization of
# identical bits is identical. The slack covers fp32 summation order (fp32 vs fp64 training:
# at most 6e-4 after int8), barely; it does not cover TF32 or another GPU's bf16 kernels.
SAME_DEVICE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Distance:
    """How far apart two updates are, over the whole update and tensor by tensor."""

    relative_l2: float  # |a - b| / max(|a|, |b|) over all tensors; 0 when both are zero
    cosine: float  # 0 when either update is zero
    per_tensor: dict[str, float]  # the same relative L2, one tensor at a time
    worst_tensor: str
    worst_tensor_l2: float


@dataclass(frozen=True)
class Agreement:
    agreed: bool
    distance: Distance
    tolerance: float  # the bound relative_l2 was held to
    same_class: bool  # both replicas claimed the same precision


def claimed_precision(metadata: Mapping[str, str]) -> str:
    """The precision an upload's metadata claims; DEFAULT_PRECISION when it names none.

    An unknown value is rejected rather than guessed: like an unknown codec, it means an
    agent this server does not understand, and a wrong guess would go unnoticed."""
    claim = metadata.get("precision", DEFAULT_PRECISION)
    if claim not in PRECISIONS:
        raise UpdateRejected(
            "metadata",
            f"unknown precision {claim[:32]!r} in the payload; expected one of "
            f"{', '.join(PRECISIONS)}",
        )
    return claim


DEVICES = ("cpu", "cuda", "mps")


def claimed_device(metadata: Mapping[str, str]) -> str:
    """The kind of device an upload's metadata says it trained on ("" when it names none);
    shown to buyers and operators, never trusted for pay or verification."""
    claim = metadata.get("device", "")
    if claim and claim not in DEVICES:
        raise UpdateRejected(
            "metadata",
            f"unknown device {claim[:32]!r} in the payload; expected one of {', '.join(DEVICES)}",
        )
    return claim


def _relative(diff_sq: float, a_sq: float, b_sq: float) -> float:
    scale_sq = max(a_sq, b_sq)
    if scale_sq <= 0.0:
        return 0.0  # both zero: identical
    return math.sqrt(diff_sq / scale_sq)


def distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> Distance:
    """Distances between two decoded updates of one model (same tensor names and shapes),
    accumulated in float64 so that a large model's sums keep their precision."""
    if set(a) != set(b):
        raise ValueError(f"the updates differ in tensors: {sorted(set(a) ^ set(b))}")
    diff_total = a_total = b_total = dot_total = 0.0
    per_tensor: dict[str, float] = {}
    for name in sorted(a):
        x = a[name].detach().reshape(-1).to(torch.float64)
        y = b[name].detach().reshape(-1).to(torch.float64)
        if x.shape != y.shape:
            raise ValueError(f"tensor {name!r} has {x.numel()} values in one, {y.numel()} in b")
        diff_sq = float(torch.sum((x - y) ** 2))
        a_sq, b_sq = float(x @ x), float(y @ y)
        per_tensor[name] = _relative(diff_sq, a_sq, b_sq)
        diff_total += diff_sq
        a_total += a_sq
        b_total += b_sq
        dot_total += float(x @ y)
    norms = math.sqrt(a_total * b_total)
    worst = max(per_tensor, key=per_tensor.__getitem__, default="")
    return Distance(
        relative_l2=_relative(diff_total, a_total, b_total),
        cosine=dot_total / norms if norms > 0 else 0.0,
        per_tensor=per_tensor,
        worst_tensor=worst,
        worst_tensor_l2=per_tensor.get(worst, 0.0),
    )


def agreement(
    a: Mapping[str, Tensor],
    b: Mapping[str, Tensor],
    precision_a: str,
    precision_b: str,
    same_class_tolerance: float = CROSS_DEVICE_TOLERANCE,
) -> Agreement:
    """Whether two replicas' decoded updates agree, given the precisions they claim.

    Replicas claiming the same class are held to `same_class_tolerance`; replicas claiming
    different classes to the larger of it and CROSS_DEVICE_TOLERANCE, since a cheater can
    always claim the other class and the rule has to catch it there too (module docstring).
    """
    for claim in (precision_a, precision_b):
        if claim not in PRECISIONS:
            raise ValueError(f"unknown precision {claim!r}; expected one of {PRECISIONS}")
    if not (math.isfinite(same_class_tolerance) and same_class_tolerance >= 0):
        raise ValueError(f"tolerance must be finite and >= 0, got {same_class_tolerance}")
    same = precision_a == precision_b
    tolerance = same_class_tolerance if same else max(CROSS_DEVICE_TOLERANCE, same_class_tolerance)
    d = distance(a, b)
    return Agreement(
        agreed=d.relative_l2 <= tolerance, distance=d, tolerance=tolerance, same_class=same
    )
