"""How fast a node really is, from its tasks: pure arithmetic, written down in docs/money.md.

A node advertises its fp32 matmul throughput (its benchmark, `fp32_tflops`), and billing
multiplies its time by that speed. What its tasks show is a different figure: the model
FLOPs it trained per second,

    samples   = steps x batch size                  (what the server asked the task to do)
    flops     = TRAIN_FLOPS_PER_PARAM x parameters x samples
    seconds   = min(reported compute seconds, seconds the server saw from lease to upload)
    achieved  = flops / seconds                     (TFLOP/s)

Training FLOPs are estimated as 6 x parameters per sample (forward 2, backward 4: the
standard approximation for dense layers; it undercounts convolutions, whose cost grows with
the image, but the same factor applies to every node of a job and cancels below).

Achieved model FLOP/s is always far below a benchmark's peak, and by how much depends on
the model (a 2,000-parameter MLP keeps a GPU busy for a ten-millionth of its peak), so the
two are never compared directly. They are compared through the node's *utilization*,
achieved / advertised, against its peers on the same job (same model, same data): honest
nodes show similar utilizations, and a node that advertises k times its real speed shows
one k-th of theirs. The job's reference utilization is the upper median of its nodes'
(at least two nodes; a lone node cannot be judged), capped at 1 (no honest GPU trains above
its peak, so a node advertising too little cannot drag every other node's figure down
without bound). A node's observed speed is then

    observed  = achieved / reference utilization    (TFLOP/s, what it would have to advertise)

kept as an exponential moving average over its settled tasks. When the advertised figure
exceeds the observed one by more than SPEED_MARGIN, billing uses the observed figure and
the node's reliability drops; a node advertising less than it shows is billed at what it
advertises (never more).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# training FLOPs per parameter and sample: forward 2, backward 4 (6 N per token/sample)
TRAIN_FLOPS_PER_PARAM = 6
# weight of a new task's estimate in the node's moving average
EMA_ALPHA = 0.3
# nodes of a job needed before any of them is judged
MIN_PEERS = 2


def achieved_tflops(parameters: int, samples: int, seconds: float) -> float | None:
    """Model TFLOP/s one task trained at, or None if there is nothing to measure."""
    if parameters <= 0 or samples <= 0 or not seconds > 0:
        return None
    return TRAIN_FLOPS_PER_PARAM * parameters * samples / seconds / 1e12


def utilization(achieved: float, advertised: float | None) -> float | None:
    """Achieved over advertised throughput; None for a node without a (positive) benchmark."""
    if not advertised or advertised <= 0:
        return None
    return achieved / advertised


def reference_utilization(by_node: Mapping[object, Iterable[float]]) -> float | None:
    """The job's reference: the upper median over nodes of each node's mean utilization
    (each node counts once, however many tasks it ran), capped at 1; None below MIN_PEERS."""
    means = []
    for values in by_node.values():
        vals = [v for v in values if v > 0]
        if vals:
            means.append(min(sum(vals) / len(vals), 1.0))
    if len(means) < MIN_PEERS:
        return None
    means.sort()
    return means[len(means) // 2]


def observed_tflops(achieved: float, reference: float) -> float:
    return achieved / reference


def ema(previous: float | None, new: float, alpha: float = EMA_ALPHA) -> float:
    return new if previous is None else previous + alpha * (new - previous)


@dataclass(frozen=True)
class SpeedVerdict:
    advertised: float | None
    observed: float | None
    billed: float | None  # the fp32 TFLOP/s billing uses
    mismatch: bool  # advertised > observed x margin

    def note(self) -> str:
        if not self.mismatch:
            return ""
        return (
            f"Advertises {self.advertised:.4g} fp32 TFLOP/s, but its tasks show about "
            f"{self.observed:.4g} (measured against the other nodes on the same jobs); it is "
            f"billed at {self.billed:.4g} and its reliability drops until its benchmark "
            "matches."
        )


def verdict(advertised: float | None, observed: float | None, margin: float) -> SpeedVerdict:
    """What billing uses: the advertised figure, unless the node's tasks show it is more than
    `margin` times too high; then the observed one."""
    if advertised is None or advertised <= 0 or observed is None:
        return SpeedVerdict(advertised, observed, advertised, False)
    mismatch = advertised > observed * margin
    return SpeedVerdict(advertised, observed, observed if mismatch else advertised, mismatch)
