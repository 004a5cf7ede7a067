"""What a job will cost and how long it will take, from the market as it is right now.

A pure function of the spec's work and the online nodes' prices and benchmarks, so that the
submit page can show it before anything is stored, and tests can check it without a database.
It is an estimate, said as one: it assumes the cheapest eligible nodes take the work, that
every round runs to `max_rounds` (a target can stop it sooner), and a fixed per-round overhead
for transfers and aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from trainer.spec import JobSpec

# Without a benchmark, a node is assumed to be slow: better to over- than under-promise.
DEFAULT_SAMPLES_PER_S = 2_000.0
# Download model and shard, upload the update, aggregate and evaluate: seconds per round.
ROUND_OVERHEAD_S = 2.0
# scikit-learn's digits, the one built-in dataset: its size is known before submitting.
BUILTIN_SIZES = {"digits": 1797}
# A job on a volunteer-heavy tier replicates some tasks to verify them (see rounds/verification).
REPLICATION_FACTOR = {"volunteer": 1.5, "hybrid": 1.25, "platform": 1.0}
CENT = Decimal("0.0001")


@dataclass(frozen=True)
class Offer:
    """One online node, as the estimate sees it."""

    price_per_gpu_hour: Decimal
    samples_per_s: float | None
    # the ledger's benchmark normalization for this node (1: the reference GPU)
    speed: float = 1.0


@dataclass(frozen=True)
class Work:
    """The spec's work: tasks per round, and steps of `batch_size` samples per task."""

    rounds: int
    tasks_per_round: int
    steps_per_task: int
    batch_size: int


@dataclass(frozen=True)
class Estimate:
    nodes: int  # nodes that would take the work in parallel
    gpu_hours: float
    cost: Decimal
    seconds: float
    price_low: Decimal
    price_high: Decimal

    def as_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "gpu_hours": round(self.gpu_hours, 6),
            "cost": str(self.cost),
            "seconds": round(self.seconds, 1),
            "price_low": str(self.price_low),
            "price_high": str(self.price_high),
        }


def work_of(spec: JobSpec, train_samples: int | None, default_shards: int) -> Work:
    """The work a spec asks for. `train_samples` is the training split's size when known
    (built-in datasets); an epoch-based spec on an unknown dataset is counted as one pass of
    1000 samples per shard."""
    local = spec.local
    shards = spec.sharding.num_shards or default_shards
    if train_samples is not None:
        shards = max(1, min(shards, train_samples))
    if local.steps:
        steps = local.steps
    else:
        per_shard = (train_samples or 1000 * shards) / shards
        steps = max(1, math.ceil((local.epochs or 1) * per_shard / local.batch_size))
    return Work(rounds=spec.rounds.max_rounds, tasks_per_round=shards, steps_per_task=steps,
                batch_size=local.batch_size)  # fmt: skip


def train_samples(spec: JobSpec) -> int | None:
    total = BUILTIN_SIZES.get(spec.dataset.kind)
    if total is None:
        return None
    return int(total * (1 - spec.dataset.test_fraction))


def estimate(
    work: Work,
    offers: Sequence[Offer],
    *,
    max_price: Decimal,
    tier: str = "hybrid",
    bonus_max: Decimal = Decimal(0),
) -> Estimate | None:
    """None when no online node is at or under `max_price`: nothing would run. Priced as the
    ledger charges (ledger/metering.py): seconds on a node x its speed factor x its price,
    plus the largest quality bonus, so the estimate errs high."""
    eligible = sorted(
        (o for o in offers if o.price_per_gpu_hour <= max_price),
        key=lambda o: o.price_per_gpu_hour,
    )
    if not eligible:
        return None
    used = eligible[: work.tasks_per_round]
    speeds = [o.samples_per_s or DEFAULT_SAMPLES_PER_S for o in used]
    samples_per_task = work.steps_per_task * work.batch_size
    # the slowest node in the cohort sets each wave's length; waves cover all tasks
    waves = math.ceil(work.tasks_per_round / len(used))
    round_s = waves * samples_per_task / min(speeds) + ROUND_OVERHEAD_S
    replication = REPLICATION_FACTOR.get(tier, 1.0)
    tasks = work.rounds * work.tasks_per_round * replication
    mean_speed = sum(speeds) / len(speeds)
    gpu_s = tasks * samples_per_task / mean_speed
    # tasks spread evenly over the cohort: each node bills its own seconds at its own rate
    per_task = sum(
        (
            o.price_per_gpu_hour * Decimal(repr(samples_per_task / s * o.speed))
            for o, s in zip(used, speeds, strict=True)
        ),
        Decimal(0),
    ) / len(used)
    base = per_task * Decimal(repr(tasks)) / Decimal(3600)
    cost = (base * (1 + bonus_max)).quantize(CENT, ROUND_HALF_UP)
    return Estimate(
        nodes=len(used),
        gpu_hours=gpu_s / 3600,
        cost=max(cost, CENT),
        seconds=work.rounds * round_s,
        price_low=used[0].price_per_gpu_hour,
        price_high=used[-1].price_per_gpu_hour,
    )


def samples_per_s(benchmark: dict, arch: str) -> float | None:
    """A node's training throughput for this architecture, from its advertised benchmark."""
    value = benchmark.get("train_samples_per_s")
    if isinstance(value, dict):
        value = value.get(arch) or value.get("mlp")
    try:
        speed = float(value)
    except (TypeError, ValueError):
        return None
    return speed if speed > 0 else None
