"""A node's one speed figure: pure arithmetic, written down in docs/money.md ("Speed").

A node advertises its fp32 matmul throughput (its benchmark, `fp32_tflops`); what its tasks
show is the model FLOPs it trained per second,

    samples   = steps x batch size                  (what the server asked the task to do)
    flops     = TRAIN_FLOPS_PER_PARAM x parameters x samples
    seconds   = the compute seconds billing meters (reported, bounded by the server's clock)
    achieved  = flops / seconds                     (TFLOP/s)

Training FLOPs are estimated as 6 x parameters per sample (forward 2, backward 4: the
standard approximation for dense layers; it undercounts convolutions, but the same factor
applies to every node of a job and cancels below).

Achieved model FLOP/s is always far below a benchmark's peak, and by how much depends on
the model (a 2,000-parameter MLP keeps a GPU busy for a ten-millionth of its peak), so the
two are never compared directly. They are compared through *utilization*, achieved /
advertised, against the job's other nodes (same model, same data): honest nodes show
similar utilizations, and a node that advertises k times its real speed shows one k-th of
theirs. The job's reference utilization is the upper median over its trusted nodes (at
least two; flagged nodes' words are not counted), capped at 1. One task's observation is

    observed  = achieved / reference utilization    (TFLOP/s: what it would have to advertise)

and the node's figure blends its observations with its benchmark as the prior (`fold`):
the benchmark counts as PRIOR_TASKS observations, so its weight, PRIOR_TASKS / (PRIOR_TASKS
+ n), shrinks as tasks accumulate. The figure is the one every consumer reads: sharding's
weights, sizing's step time, the lease's reservation and the charge.

A node whose observations, over at least FLAG_TASKS tasks, fall below its benchmark / margin
is flagged (its benchmark is no longer trusted: the figure is the observed mean alone); and
a single observation that far below already sets the figure aside from the prior, so that an
overstated benchmark is never paid for, not even for the tasks before the flag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# training FLOPs per parameter and sample: forward 2, backward 4 (6 N per token/sample)
TRAIN_FLOPS_PER_PARAM = 6
# the smallest weight of a new observation in the observed mean (1/n before that): past 20
# tasks the mean follows a machine that changed (a new GPU, a busier owner), and is still
# steady enough under honest noise (sigma 0.6 per task) never to cross the margin
MIN_GAIN = 0.05
# nodes of a job whose words are trusted needed before any of them is judged
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


@dataclass(frozen=True)
class Speed:
    """A node's speed state as its row keeps it (Node.speed_*)."""

    advertised: float | None  # its benchmark's fp32 TFLOP/s (the prior)
    observed: float | None  # the mean (in log space) of its tasks' observations
    tasks: int  # observations folded in
    figure: float | None  # THE figure: what sharding, sizing and billing read
    flag: str  # why its benchmark is not trusted; "" while it is

    @property
    def flagged(self) -> bool:
        return bool(self.flag)


def figure(
    advertised: float | None, observed: float | None, tasks: int, *, prior_tasks: float,
    margin: float, flagged: bool = False,
) -> float | None:  # fmt: skip
    """The blend: the benchmark weighs as `prior_tasks` observations (geometric mean, since
    speeds are ratios). An observed mean below benchmark / margin sets the prior aside, as
    does a flag; with no benchmark the observations alone speak."""
    if advertised is None or advertised <= 0:
        return observed
    if observed is None or tasks <= 0:
        return advertised
    if flagged or observed * margin < advertised:
        return observed
    w = prior_tasks / (prior_tasks + tasks) if prior_tasks > 0 else 0.0
    return math.exp(w * math.log(advertised) + (1 - w) * math.log(observed))


def fold(
    state: Speed, observation: float, *, prior_tasks: float, margin: float, flag_tasks: int
) -> Speed:
    """`state` with one task's observation (TFLOP/s, > 0) folded in, flag and figure anew."""
    tasks = state.tasks + 1
    if state.observed is None or state.observed <= 0:
        observed = observation
    else:
        gain = max(1.0 / tasks, MIN_GAIN)
        observed = math.exp(
            math.log(state.observed) + gain * (math.log(observation) - math.log(state.observed))
        )
    adv = state.advertised
    flag = ""
    if adv and adv > 0 and tasks >= flag_tasks and observed * margin < adv:
        flag = (
            f"Advertises {adv:.4g} fp32 TFLOP/s, but its last {min(tasks, 99)} tasks show about "
            f"{observed:.4g} (against the other nodes on the same jobs); its benchmark is not "
            "trusted: it is sized and billed at what its tasks show."
        )
    fig = figure(adv, observed, tasks, prior_tasks=prior_tasks, margin=margin,
                 flagged=bool(flag))  # fmt: skip
    return Speed(adv, observed, tasks, fig, flag)
