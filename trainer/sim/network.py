"""Network, compute and fixed-cost models for the simulator.

The kernel here has no netem, so transfers are charged time by a model instead of being
shaped: latency (one RTT to set up a request), bandwidth, and TCP's loss-limited rate
(Mathis et al. 1997: rate <= MSS / RTT * 1.22 / sqrt(p)). Every random draw is a pure
function of (seed, node, round), so a run resumed from a checkpoint sees the same network.
What the real system spends besides transfers and compute is charged as fixed costs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MSS_BYTES = 1460
# Compute model for a nominal node (speed 1.0): a fixed per-step cost for kernel launches,
# the optimizer step and the Python loop, plus FLOPs at an effective rate. Small models on a
# real GPU are overhead-bound, which is what the fixed term captures.
STEP_OVERHEAD_S = 2e-3
EFFECTIVE_FLOPS = 10e12


@dataclass(frozen=True)
class FixedCosts:
    """What a real round costs besides transfers and compute, as the marketplace runs it.

    `task_s` is paid once by every task a node runs, before its download: being woken and
    leasing the task, starting the sandbox, imports, encoding, the agent's bookkeeping.
    `round_s` is paid once per round, between the last needed update arriving and the next
    round opening: verification, the aggregation queue, aggregation, opening the next round.
    """

    task_s: float
    round_s: float

    def __post_init__(self) -> None:
        for name in ("task_s", "round_s"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"fixed cost {name} must be finite and >= 0, got {value}")


# Medians of the round-phase bench (`python -m bench.run --only rounds`; bench/results/
# results.json, "rounds"): plain FedAvg on the digits MLP, five lan agents, per phase of the
# round's critical path. Verification measured ~0 (slightly negative: clock noise) and is left
# out; aggregation is included because the simulator does not time it itself.
# warm (the default, tasks forked from a warm worker):
#   task_s  = claim wait 0.42 + sandbox start 0.021 + imports 0.0045 + encode 0.0035
#             + agent other 0.070 = 0.52
#   round_s = queue wait 0.093 + aggregation 0.028 + next open 0.042 = 0.16
# cold (GPUFLEX_WARM_TASKS=0, a fresh interpreter per task):
#   task_s  = 10.7 + 0.27 + 5.08 + 0.0056 + 2.09 = 18.1
#   round_s = 0.074 + 0.025 + 0.035 = 0.13
WARM_TASKS = FixedCosts(task_s=0.52, round_s=0.16)
COLD_TASKS = FixedCosts(task_s=18.1, round_s=0.13)
NO_FIXED_COSTS = FixedCosts(task_s=0.0, round_s=0.0)  # the pure transfer and compute model
FIXED_COSTS = {"warm": WARM_TASKS, "cold": COLD_TASKS, "none": NO_FIXED_COSTS}


@dataclass(frozen=True)
class NodeProfile:
    node: int
    rtt_s: float
    loss: float  # packet loss probability
    up_bps: float
    down_bps: float
    speed: float  # compute speed relative to the nominal node
    disconnect_p: float  # chance to drop out during any one round

    def transfer_s(self, nbytes: int, upload: bool) -> float:
        """Seconds to move `nbytes` to (upload) or from the coordinator."""
        link = self.up_bps if upload else self.down_bps
        if self.loss > 0:
            link = min(link, 8 * MSS_BYTES / self.rtt_s * 1.22 / math.sqrt(self.loss))
        return self.rtt_s + 8 * nbytes / link

    def step_s(self, train_flops_per_step: float) -> float:
        return (STEP_OVERHEAD_S + train_flops_per_step / EFFECTIVE_FLOPS) / self.speed


@dataclass(frozen=True)
class NetworkProfile:
    name: str
    rtt_ms: tuple[float, float]
    loss: tuple[float, float]
    mbit: tuple[float, float]
    speed_spread: float = 1.0  # fastest / slowest compute
    disconnect_p: float = 0.0
    description: str = ""
    # profiles built on another draw the same links from it, so "flaky" is "wan" plus
    # disconnects, not a different set of nodes
    draws_from: str | None = None

    def nodes(self, n: int, seed: int) -> list[NodeProfile]:
        return [self.node(i, n, seed) for i in range(n)]

    def node(self, i: int, n: int, seed: int) -> NodeProfile:
        rng = random.Random(f"{self.draws_from or self.name}:{seed}:{i}")
        mbit = rng.uniform(*self.mbit)
        # Spread speeds evenly on a log scale so a 4x profile really has a 4x gap.
        frac = i / (n - 1) if n > 1 else 0.0
        speed = self.speed_spread ** (-frac)
        return NodeProfile(
            node=i,
            rtt_s=rng.uniform(*self.rtt_ms) / 1000,
            loss=rng.uniform(*self.loss),
            up_bps=mbit * 1e6,
            down_bps=mbit * 1e6,
            speed=speed,
            disconnect_p=self.disconnect_p,
        )


PROFILES: dict[str, NetworkProfile] = {
    p.name: p
    for p in (
        NetworkProfile("lan", (1, 1), (0, 0), (10_000, 10_000), description="1 ms RTT, 10 Gbit/s"),
        NetworkProfile(
            "wan",
            (50, 300),
            (0, 0.05),
            (20, 200),
            description="50-300 ms RTT, 0-5 % loss, 20-200 Mbit/s per node",
        ),
        NetworkProfile(
            "flaky",
            (50, 300),
            (0, 0.05),
            (20, 200),
            disconnect_p=0.2,
            description="wan, and each node drops out of a round with probability 0.2",
            draws_from="wan",
        ),
        NetworkProfile(
            "hetero",
            (50, 300),
            (0, 0.05),
            (20, 200),
            speed_spread=4.0,
            description="wan, with node compute speeds spread 4x",
            draws_from="wan",
        ),
    )
}


class UnknownProfile(ValueError):
    pass


def get_profile(name: str) -> NetworkProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(
            f"unknown network profile '{name}'; choose one of {', '.join(PROFILES)}"
        ) from None


def disconnects(profile: NodeProfile, seed: int, round_: int) -> float | None:
    """If the node drops out this round, the fraction of its work done before it vanished."""
    if profile.disconnect_p <= 0:
        return None
    rng = random.Random(f"drop:{seed}:{profile.node}:{round_}")
    if rng.random() >= profile.disconnect_p:
        return None
    return rng.random()


def ring_allreduce_s(nodes: list[NodeProfile], nbytes: int) -> float:
    """Ring all-reduce (what DDP and Horovod do): 2(N-1) steps of nbytes/N on every link.

    Nodes on a WAN reach each other through their own uplinks, so a link's one-way latency
    is half of each end's RTT added up, and its rate the slower end's; each step waits for
    the slowest link.
    """
    n = len(nodes)
    if n < 2:
        return 0.0
    chunk = nbytes / n
    step = 0.0
    for i, a in enumerate(nodes):
        b = nodes[(i + 1) % n]
        latency = (a.rtt_s + b.rtt_s) / 2
        rate = min(a.up_bps, b.down_bps)
        for p in (a, b):
            if p.loss > 0:
                rate = min(rate, 8 * MSS_BYTES / p.rtt_s * 1.22 / math.sqrt(p.loss))
        step = max(step, latency + 8 * chunk / rate)
    return 2 * (n - 1) * step
